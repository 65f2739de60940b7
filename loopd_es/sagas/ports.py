"""What the sagas need from the application layer, as a protocol: ``app/`` implements it and passes it in.

The sagas drive host calls and record their outcomes, but deciding goal commands and appending with causal
links is the goal service's job (:class:`loopd_es.app.service.GoalService`). Declaring that dependency here
keeps the layers one-way: ``app`` imports ``sagas``, never the reverse.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeAlias

import msgspec

from ..events.base import Caller, Event
from ..events.envelope import ANY, ExpectedVersion, new_event_id

if TYPE_CHECKING:
    from ..clock import Clock
    from ..domain import goal_commands as c
    from ..domain.state import GoalState
    from ..events.envelope import Envelope
    from ..host.base import WorkerHost
    from ..log.base import LogStore


class Ctx(msgspec.Struct, frozen=True):
    """The causal links of what is being written: the flow (correlation) and the direct cause (causation)."""

    correlation_id: str
    causation_id: str
    caller: Caller | None = None
    """The OpenCode tool call that made the request, if one did: stamped on the events that record who acted."""

    @classmethod
    def new(cls, caller: Caller | None = None) -> Ctx:
        """A fresh flow whose root cause is the request itself (both ids the same)."""
        request = new_event_id()
        return cls(request, request, caller)

    def caused_by(self, event_id: str) -> Ctx:
        """The same flow, caused by the event ``event_id``."""
        return Ctx(self.correlation_id, event_id, self.caller)

    def stamp(self, event: Event) -> Event:
        """``event`` with :attr:`caller` as its ``called_by`` where its type records one (unchanged otherwise)."""
        if self.caller is None or "called_by" not in event.__struct_fields__:
            return event
        return msgspec.structs.replace(event, called_by=self.caller)


Companion: TypeAlias = "Callable[[Sequence[Event]], tuple[str, Sequence[Event], ExpectedVersion] | None]"
"""Given a decision's goal events, the events another stream must record with them (stream, events, expected
version), or None: what :meth:`GoalPort.execute_with` writes in the same atomic append."""


class GoalPort(Protocol):
    """The goal service as the sagas use it: the log, the host, the clock, load/decide/append."""

    store: LogStore
    host: WorkerHost
    clock: Clock

    async def load(self, goal_id: str) -> GoalState:
        """The goal folded from its stream."""
        ...

    async def execute(self, command: c.GoalCommand, ctx: Ctx) -> list[Envelope]:
        """Decide ``command`` on the goal's current version and append the result (re-decided on conflict)."""
        ...

    async def execute_with(
        self, command: c.GoalCommand, ctx: Ctx, companion: Companion
    ) -> tuple[list[Envelope], list[Envelope]]:
        """:meth:`execute`, with ``companion``'s events for another stream in the same atomic append."""
        ...

    async def append(
        self,
        stream: str,
        events: Sequence[Event],
        ctx: Ctx,
        *,
        for_goal: str | None,
        expected: ExpectedVersion = ANY,
    ) -> list[Envelope]:
        """Append payloads to any stream with the flow's causal links, fenced for goal ``for_goal``."""
        ...
