"""The identity-switch saga (docs/reference/loopd.md#s3-10 step 7): host first, then one recorded switch;
compensate on failure.

Flow for a request the decider accepted (``identity.switch_requested`` on the goal stream)::

    switch-<id>: saga.switch_started (previous identity, for rollback)
                 saga.host_call_intended  forward/switch_model ─► host.switch_model ─► saga.host_call_succeeded
                 saga.host_call_intended  forward/switch_agent ─► host.switch_agent ─► saga.host_call_failed
                 saga.host_call_intended  compensate/switch_model ─► host.switch_model(previous) ─► ...succeeded
    goal-<id>:   identity.switch_failed + identity.switch_rolled_back   (RecordSwitchOutcome, decided)
    switch-<id>: saga.switch_finished  outcome=rolled-back

Model before agent; compensation in reverse (agent, then model). The goal's recorded identity changes only in
the one ``identity.switch_applied`` written after every host call succeeded, so no replay can show a half
switch. A host error's raw text is never recorded (only its ``reason`` code).

Recovery (``recovering=True``) never makes a forward call: an open intent is resolved from the live session
identity; when every half is live the switch is recorded as applied, otherwise the halves that landed are
compensated and the switch is recorded as failed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Final, Literal

import msgspec

from ..clock import whole_ms
from ..domain import goal_commands as c
from ..domain.streams import goal_stream
from ..errors import ConflictError, WrongExpectedVersionError
from ..events import identity as i
from ..events import saga as s
from ..events.catalogue import decode_payload
from ..host.errors import HostError, HostUnavailableError
from .crashpoints import crashpoint
from .switch_state import CallState, SwitchSagaState, call_key, switch_stream

if TYPE_CHECKING:
    from ..domain.state import GoalState
    from ..events.base import Event
    from ..events.envelope import Envelope
    from .ports import Ctx, GoalPort

RUNNING: Final[set[str]] = set()
"""Switch ids whose saga runs in this process right now; recovery leaves them alone."""

APPLIED: Final = "Identity switched to {model} / {agent} on the same worker/session."
DEFERRED: Final = "Identity switch deferred until the next permitted idle turn/prompt; no implicit wake."
UNSUPPORTED: Final = (
    "Identity switch unsupported on this host (see loopd_list_models). Goal/session retained."
)
REJECTED: Final = (
    "Switch rejected: verify ownership, identity availability, resume eligibility and host capability with "
    "loopd_list_models and inspect_background_goal. Existing goal/session retained. Inspect live session "
    "identity before retrying if host rollback failed."
)
ROLLBACK_FAILED: Final = (
    "Identity switch failed and host rollback failed; inspect the existing session before retrying."
)
UNKNOWN_PREVIOUS: Final = "Combined switch requires a known previous identity for rollback."
PENDING_REJECTED: Final = {
    "identity": "Pending identity switch was not accepted; goal blocked without replacing its worker.",
    "model": "Pending model switch was not accepted; goal blocked without replacing its worker.",
    "agent": "Pending agent switch was not accepted; goal blocked without replacing its worker.",
}

_OUTCOME_TYPES: Final = {
    i.IdentitySwitchApplied.event_type,
    i.IdentitySwitchFailed.event_type,
    i.IdentitySwitchUnsupported.event_type,
    i.IdentitySwitchRolledBack.event_type,
    i.IdentityRollbackFailed.event_type,
}


class SwitchReport(msgspec.Struct, kw_only=True):
    """How a switch ended, as the CLI reports it (``outcome`` ``deferred`` only before any saga ran)."""

    goal_id: str
    switch_id: str
    outcome: s.SagaOutcome | Literal["deferred"]
    model: str | None = None
    agent: str | None = None
    resumed: bool = False
    pending: bool = False
    target: i.SwitchTarget = "identity"
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.outcome in ("applied", "next-prompt", "deferred")

    def message(self) -> str:
        """The reference's words for this outcome (``next-prompt`` is reported as deferred,
        docs/reference/loopd.md#s3-10 step 8)."""
        if self.outcome == "applied":
            return APPLIED.format(model=self.model or "-", agent=self.agent or "-")
        if self.outcome in ("deferred", "next-prompt"):
            return DEFERRED
        if self.outcome == "unsupported":
            return UNSUPPORTED
        if self.error:
            return self.error
        if self.pending:
            return PENDING_REJECTED[self.target]
        return ROLLBACK_FAILED if self.outcome == "rollback-failed" else REJECTED


class SwitchSaga:
    """Runs switch sagas for one :class:`~loopd_es.sagas.ports.GoalPort` (the goal service: its store and host)."""

    def __init__(self, service: GoalPort) -> None:
        self.service = service
        self.host = service.host

    async def load(self, switch_id: str) -> SwitchSagaState:
        """The saga folded from its stream (empty when it never started)."""
        state = SwitchSagaState(switch_id=switch_id)
        stream = switch_stream(switch_id)
        if await self.service.store.stream_version(stream):
            async for envelope in self.service.store.read_stream(stream):
                state.apply(envelope)
        return state

    async def start(self, requested: Envelope, ctx: Ctx) -> SwitchReport:
        """Take charge of a recorded ``identity.switch_requested`` and run it to its end.

        :raises ConflictError: when recovery in another process took the saga over first.
        """
        event = decode_payload(requested)
        assert isinstance(event, i.IdentitySwitchRequested)
        RUNNING.add(event.switch_id)
        try:
            ctx = ctx.caused_by(requested.event_id)
            saga = await self._begin(event, ctx)
            return await self.drive(saga, ctx, recovering=False)
        finally:
            RUNNING.discard(event.switch_id)

    async def begin_recovered(self, goal_id: str, switch_id: str, ctx: Ctx) -> SwitchSagaState:
        """Start the saga of a request whose process died before it could (no host call was made)."""
        goal = await self.service.load(goal_id)
        flight = goal.switch_in_flight
        model = flight.model if flight is not None and flight.switch_id == switch_id else None
        agent = flight.agent if flight is not None and flight.switch_id == switch_id else None
        pending = flight.pending if flight is not None else False
        request = i.IdentitySwitchRequested(
            goal_id=goal_id, switch_id=switch_id, model=model, agent=agent, pending=pending
        )
        return await self._begin(request, ctx, live_lookup=False)

    async def _begin(
        self, event: i.IdentitySwitchRequested, ctx: Ctx, *, live_lookup: bool = True
    ) -> SwitchSagaState:
        goal = await self.service.load(event.goal_id)
        session = goal.worker_session_id or ""
        from_model, from_agent = goal.config.model, goal.config.agent
        if live_lookup and session and (from_model is None or from_agent is None):
            try:  # the reference falls back to the live identity for the rollback target
                live = await self.host.session_identity(session)
                from_model, from_agent = from_model or live.model, from_agent or live.agent
            except HostError:
                pass
        started = s.SwitchSagaStarted(
            switch_id=event.switch_id,
            goal_id=event.goal_id,
            session_id=session,
            model=event.model,
            agent=event.agent,
            from_model=from_model,
            from_agent=from_agent,
            pending=event.pending,
            owner_pid=os.getpid(),
            at=whole_ms(self.service.clock.now()),
        )
        try:
            recorded = await self.service.append(
                switch_stream(event.switch_id), [started], ctx, for_goal=event.goal_id, expected=0
            )
        except WrongExpectedVersionError:
            raise ConflictError(
                f"identity switch {event.switch_id} was taken over by recovery in another process; "
                "inspect the goal before retrying"
            ) from None
        return SwitchSagaState(switch_id=event.switch_id).fold(recorded)

    async def drive(self, saga: SwitchSagaState, ctx: Ctx, *, recovering: bool) -> SwitchReport:
        """Run (or, when ``recovering``, settle) the saga from wherever its stream says it is."""
        st = saga.started
        assert st is not None
        goal = await self.service.load(st.goal_id)
        flight = goal.switch_in_flight
        if saga.finished is not None or not goal.exists or flight is None or flight.switch_id != st.switch_id:
            outcome = saga.finished or await self._goal_outcome(st) or "abandoned"
            return await self._finish(saga, ctx, outcome, recovering)
        forward: list[tuple[s.HostCall, str]] = []
        if st.model is not None:
            forward.append(("switch_model", st.model))
        if st.agent is not None:
            forward.append(("switch_agent", st.agent))
        combined = len(forward) == 2
        error = None
        results: dict[str, c.HostResult] = {}
        all_ok = True
        if combined and (st.from_model is None or st.from_agent is None) and not saga.calls:
            error, all_ok = UNKNOWN_PREVIOUS, False
        for op, arg in forward:
            key = call_key(st.switch_id, "forward", op)
            call = saga.calls.get(key)
            if call is None:
                if recovering or not all_ok:
                    results[op] = "rejected"
                    all_ok = False
                    continue
                call = await self._call(saga, key, op, arg, "forward", ctx)
            elif call.status == "open":
                call = await self._resolve(saga, call, ctx)
            results[op] = call.host_result()
            all_ok = all_ok and call.ok
        goal = await self.service.load(st.goal_id)
        refused = all_ok and goal.status == "complete"  # completed meanwhile: keep the recorded identity
        rolled_back = None if all_ok and not refused else await self._compensate(saga, ctx)
        command = c.RecordSwitchOutcome(
            goal_id=st.goal_id,
            switch_id=st.switch_id,
            model_result=results.get("switch_model"),
            agent_result=results.get("switch_agent"),
            rolled_back=rolled_back,
            persist_failed=refused,
            # settled by recovery with no host refusal on record: the process died before the host answered
            interrupted=recovering and not any(x.status == "failed" for x in saga.calls.values()),
        )

        def finished(events: Sequence[Event]) -> tuple[str, Sequence[Event], int] | None:
            """The saga's last step, recorded in the same append as the goal outcome it decides."""
            decided = _outcome_of({e.event_type: e for e in events})
            if decided is None:
                return None
            done = s.SwitchSagaFinished(
                switch_id=st.switch_id, goal_id=st.goal_id, outcome=decided, recovered=recovering
            )
            return switch_stream(st.switch_id), [done], saga.version

        recorded, done = await self.service.execute_with(command, ctx, finished)
        saga.fold(done)
        outcome = _outcome_of({e.type: e for e in recorded}) or await self._goal_outcome(st) or "abandoned"
        report = await self._finish(saga, ctx, outcome, recovering)
        report.resumed = any(e.type == "goal.resumed" for e in recorded)
        report.error = error if outcome in ("failed", "rolled-back") else None
        return report

    async def _call(
        self, saga: SwitchSagaState, key: str, op: s.HostCall, arg: str, purpose: s.Purpose, ctx: Ctx
    ) -> CallState:
        """Intent, host call, outcome: the one way this saga touches the host."""
        st = saga.started
        assert st is not None
        intent = s.HostCallIntended(
            switch_id=st.switch_id,
            key=key,
            op=op,
            arg=arg,
            purpose=purpose,
            at=whole_ms(self.service.clock.now()),
        )
        await self._record(saga, intent, ctx)
        crashpoint(f"before host {purpose} {op}")
        try:
            if op == "switch_model":
                result = await self.host.switch_model(st.session_id, arg)
            else:
                result = await self.host.switch_agent(st.session_id, arg)
        except HostUnavailableError:  # it may have landed: the live identity says
            crashpoint(f"after host {purpose} {op}")
            return await self._resolve(saga, saga.calls[key], ctx)
        except HostError as e:
            crashpoint(f"after host {purpose} {op}")
            await self._record(saga, s.HostCallFailed(switch_id=st.switch_id, key=key, reason=e.reason), ctx)
            return saga.calls[key]
        crashpoint(f"after host {purpose} {op}")
        await self._record(saga, s.HostCallSucceeded(switch_id=st.switch_id, key=key, result=result), ctx)
        return saga.calls[key]

    async def _resolve(self, saga: SwitchSagaState, call: CallState, ctx: Ctx) -> CallState:
        """Settle a call of unknown outcome from the session's live identity.

        :raises HostError: when the live identity cannot be read (the saga stays open for a later recovery).
        """
        st = saga.started
        assert st is not None
        live = await self.host.session_identity(st.session_id)
        landed = (live.model if call.op == "switch_model" else live.agent) == call.arg
        resolved = s.HostCallResolved(
            switch_id=st.switch_id, key=call.key, landed=landed, live_model=live.model, live_agent=live.agent
        )
        await self._record(saga, resolved, ctx)
        return saga.calls[call.key]

    async def _compensate(self, saga: SwitchSagaState, ctx: Ctx) -> bool | None:
        """Switch back every half that changed the live session (agent, then model); ``None``: nothing to undo."""
        st = saga.started
        assert st is not None
        ok: bool | None = None
        for op in ("switch_agent", "switch_model"):
            done = saga.calls.get(call_key(st.switch_id, "forward", op))
            if done is None or not done.changed_host:
                continue
            previous = st.from_agent if op == "switch_agent" else st.from_model
            if previous is None:
                ok = False
                continue
            key = call_key(st.switch_id, "compensate", op)
            call = saga.calls.get(key)
            if call is None:
                call = await self._call(saga, key, op, previous, "compensate", ctx)
            elif call.status == "open":
                call = await self._resolve(saga, call, ctx)
            ok = (ok is not False) and call.ok
        return ok

    async def _record(self, saga: SwitchSagaState, event: Event, ctx: Ctx) -> None:
        assert saga.started is not None
        recorded = await self.service.append(
            switch_stream(saga.switch_id), [event], ctx, for_goal=saga.started.goal_id, expected=saga.version
        )
        saga.fold(recorded)

    async def _finish(
        self, saga: SwitchSagaState, ctx: Ctx, outcome: s.SagaOutcome, recovering: bool
    ) -> SwitchReport:
        st = saga.started
        assert st is not None
        if saga.finished is None:
            done = s.SwitchSagaFinished(
                switch_id=st.switch_id, goal_id=st.goal_id, outcome=outcome, recovered=recovering
            )
            await self._record(saga, done, ctx)
        goal: GoalState = await self.service.load(st.goal_id)
        target: i.SwitchTarget = "identity" if st.model and st.agent else ("model" if st.model else "agent")
        return SwitchReport(
            goal_id=st.goal_id,
            switch_id=st.switch_id,
            outcome=saga.finished or outcome,
            model=goal.config.model,
            agent=goal.config.agent,
            pending=st.pending,
            target=target,
        )

    async def _goal_outcome(self, st: s.SwitchSagaStarted) -> s.SagaOutcome | None:
        """The outcome the goal stream already records for this switch (a crash after that append)."""
        stream = goal_stream(st.goal_id)
        if not await self.service.store.stream_version(stream):
            return None
        found = [
            e
            async for e in self.service.store.read_stream(stream)
            if e.type in _OUTCOME_TYPES and e.data_dict().get("switch_id") == st.switch_id
        ]
        return _outcome_of({e.type: e for e in found})


def _outcome_of(types: Mapping[str, Envelope | Event]) -> s.SagaOutcome | None:
    """The saga outcome a goal's events (recorded envelopes or decided payloads, by type) say."""
    if i.IdentitySwitchApplied.event_type in types:
        found = types[i.IdentitySwitchApplied.event_type]
        applied = found if isinstance(found, i.IdentitySwitchApplied) else decode_payload(found)  # type: ignore[arg-type]
        assert isinstance(applied, i.IdentitySwitchApplied)
        return "next-prompt" if applied.outcome == "next-prompt" else "applied"
    if i.IdentityRollbackFailed.event_type in types:
        return "rollback-failed"
    if i.IdentitySwitchRolledBack.event_type in types:
        return "rolled-back"
    if i.IdentitySwitchFailed.event_type in types:
        return "failed"
    if i.IdentitySwitchUnsupported.event_type in types:
        return "unsupported"
    return None
