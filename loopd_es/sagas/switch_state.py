"""The folded state of one switch saga (``switch-<switch_id>``): its start, each host call, its finish.

A host call is keyed by its idempotency key ``<switch_id>/<purpose>/<op>``: there is at most one forward and
one compensating call per half, so a resumed saga finds what it already did by key and never repeats it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Final, Literal

import msgspec

from ..events import saga as s
from ..events.catalogue import decode_payload

if TYPE_CHECKING:
    from ..events.envelope import Envelope

SWITCH_PREFIX: Final = "switch-"
HostResult = Literal["applied", "next-prompt", "rejected", "unsupported", "busy"]


def switch_stream(switch_id: str) -> str:
    """The stream of one switch saga run."""
    return f"{SWITCH_PREFIX}{switch_id}"


def call_key(switch_id: str, purpose: s.Purpose, op: s.HostCall) -> str:
    """The idempotency key of one host call of a saga."""
    return f"{switch_id}/{purpose}/{op}"


class CallState(msgspec.Struct, kw_only=True):
    """One host call: ``open`` from its intent until its outcome (or its resolution after a crash)."""

    key: str
    op: s.HostCall
    arg: str
    purpose: s.Purpose
    status: Literal["open", "succeeded", "failed", "resolved"] = "open"
    result: str | None = None
    reason: str | None = None
    landed: bool | None = None

    @property
    def ok(self) -> bool:
        """The host took it (now, or with the next prompt)."""
        if self.status == "succeeded":
            return self.result in ("applied", "next-prompt")
        return self.status == "resolved" and bool(self.landed)

    @property
    def changed_host(self) -> bool:
        """The live session changed because of it, so undoing it needs a compensating call."""
        return (self.status == "succeeded" and self.result == "applied") or (
            self.status == "resolved" and bool(self.landed)
        )

    def host_result(self) -> HostResult:
        """The call as :class:`~loopd_es.domain.goal_commands.RecordSwitchOutcome` reports it."""
        if self.status == "succeeded" and self.result in ("applied", "next-prompt", "unsupported"):
            return self.result  # type: ignore[return-value]
        if self.status == "resolved" and self.landed:
            return "applied"
        return "busy" if self.reason == "busy" else "rejected"


class SwitchSagaState(msgspec.Struct, kw_only=True):
    """What one switch saga has done so far."""

    switch_id: str
    started: s.SwitchSagaStarted | None = None
    calls: dict[str, CallState] = msgspec.field(default_factory=dict)
    finished: s.SagaOutcome | None = None
    version: int = 0
    flow: tuple[str, str] | None = None
    """``(correlation_id, causation_id)`` of the start: the flow a resumed saga keeps writing in."""

    def apply(self, envelope: Envelope) -> None:
        """Fold one event of the saga's stream (in place: the saga driver owns its state)."""
        event = decode_payload(envelope)
        self.version = envelope.version
        if isinstance(event, s.SwitchSagaStarted):
            self.started = event
            if envelope.correlation_id and envelope.causation_id:
                self.flow = (envelope.correlation_id, envelope.causation_id)
        elif isinstance(event, s.HostCallIntended):
            self.calls[event.key] = CallState(
                key=event.key, op=event.op, arg=event.arg, purpose=event.purpose
            )
        elif isinstance(event, s.HostCallSucceeded | s.HostCallFailed | s.HostCallResolved):
            call = self.calls.get(event.key)
            if call is None:
                return
            if isinstance(event, s.HostCallSucceeded):
                call.status, call.result = "succeeded", event.result
            elif isinstance(event, s.HostCallFailed):
                call.status, call.reason = "failed", event.reason
            else:
                call.status, call.landed = "resolved", event.landed
        elif isinstance(event, s.SwitchSagaFinished):
            self.finished = event.outcome

    def fold(self, envelopes: Iterable[Envelope]) -> SwitchSagaState:
        for envelope in envelopes:
            self.apply(envelope)
        return self
