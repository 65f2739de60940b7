"""``Goals``: the use cases the CLI offers, each a short flow of decided commands, host calls and sagas.

Explicit owner actions (create's first turn, resume, retry, a switch with ``resume``) may start a turn on any
goal; the engine's own continuation (``idle``) never prompts an interactive goal. Every flow takes one
:class:`~loopd_es.app.service.Ctx`: the events it writes share one correlation id, and each step names the
event that caused it.
"""

from __future__ import annotations

import os
import uuid
from typing import TYPE_CHECKING, Any, Literal

from ..clock import stamp
from ..domain import goal_commands as c
from ..errors import ConflictError
from ..events.envelope import Envelope, new_event_id
from ..host.errors import HostError
from ..ids import check_id
from ..procs.awaits import cancel_goal_awaits
from ..sagas.fallback import Source, observe_provider_error
from ..sagas.identity_switch import SwitchReport, SwitchSaga
from ..sagas.recovery import recover
from .service import Ctx, GoalService
from .turns import USAGE_WINDOW, Guard, Kind, Transcript, TurnStarter, usage_of
from .turns import TurnReport as TurnReport

if TYPE_CHECKING:
    from ..domain.state import GoalState


class SwitchFailedError(ConflictError):
    """Raised when the host did not take an identity switch (or a pending one); the message is the reference's."""

    def __init__(self, report: SwitchReport) -> None:
        self.report = report
        super().__init__(report.message())


class Goals:
    """The goal use cases over one :class:`GoalService`."""

    def __init__(self, service: GoalService, guard: Guard | None = None) -> None:
        self.service = service
        self.host = service.host
        self.switches = SwitchSaga(service)
        self.turns = TurnStarter(service, self, guard)

    async def recover(self, ctx: Ctx | None = None, *, only: str | None = None) -> list[SwitchReport]:
        """Settle the switch sagas a crashed process left open (run before any other use case); of one goal
        with ``only`` (a shared engine, when it claims the goal)."""
        ctx = ctx or Ctx.new()
        reports = await recover(self.service, ctx, only=only)
        for goal_id in dict.fromkeys(r.goal_id for r in reports):
            await self.run_requested(goal_id, ctx)
        return reports

    async def run_requested(self, goal_id: str, ctx: Ctx) -> TurnReport | None:
        """The turn an owner asked for while a switch was in flight, once no switch is (``None``: none waits).

        Whoever ends a switch calls this (the switching process, recovery, the engine's maintenance); the
        ``run.started`` of whichever turn starts first consumes the request, so the turn runs once.
        """
        state = await self.service.load(goal_id)
        request = state.turn_requested
        if request is None or state.switch_in_flight is not None or state.status != "active":
            return None
        return await self._owner_turn(goal_id, ctx, force=request.force, kind=request.kind)

    # -- lifecycle ------------------------------------------------------------------------------------

    async def create(
        self,
        name: str,
        objective: str,
        ctx: Ctx,
        *,
        goal_id: str | None = None,
        fallback_models: tuple[str, ...] = (),
        **options: Any,
    ) -> GoalState:
        """Create a goal, its worker session and its first turn (interactive goals get it too, as in
        docs/reference/loopd.md#s3-1).

        ``options`` are :class:`~loopd_es.domain.goal_commands.CreateGoal` fields (``None``: absent).
        """
        goal_id = (
            check_id("goal", goal_id) if goal_id is not None else str(uuid.uuid4())
        )  # it names a directory
        command = c.CreateGoal(
            goal_id=goal_id,
            name=name,
            objective=objective,
            owner_session_id=self.service.owner,
            fallback_models=fallback_models or None,
            **options,
        )
        created = await self.service.execute(command, ctx)
        make_artifact_dir(await self.service.load(goal_id))
        assigned = await self.ensure_worker(goal_id, ctx.caused_by(created[-1].event_id))
        if assigned and assigned[-1].type == "goal.worker_assigned":
            await self.continue_turn(goal_id, ctx.caused_by(assigned[-1].event_id), explicit=True)
        return await self.service.load(goal_id)

    async def ensure_worker(self, goal_id: str, ctx: Ctx) -> list[Envelope]:
        """Give an active goal without a worker session one (docs/reference/loopd.md#s3-1, #s3-4: create, resume
        and retry make one only when none is recorded). A host that refuses records the failure (the goal is
        blocked again, with why); ``[]`` when there is nothing to do or the goal went away meanwhile."""
        state = await self.service.load(goal_id)
        if not state.exists or state.status != "active" or state.worker_session_id is not None:
            return []
        try:
            worker = await self.host.create_worker(
                title=f"loopd: {state.name}", model=state.config.model, agent=state.config.agent
            )
        except HostError as e:
            return await self.service.execute(c.RecordWorkerFailure(goal_id=goal_id, detail=str(e)), ctx)
        return await self._assign_worker(goal_id, worker.session_id, ctx)

    async def _assign_worker(self, goal_id: str, session_id: str, ctx: Ctx) -> list[Envelope]:
        """Record the new worker on the goal's current version; nothing when the goal went away meanwhile."""
        return await self.service.execute(c.AssignWorker(goal_id=goal_id, worker_session_id=session_id), ctx)

    async def pause(self, goal_id: str, ctx: Ctx) -> list[Envelope]:
        """Pause an active goal and abort its worker's run (best effort); the session is kept."""
        recorded = await self.service.execute(c.PauseGoal(goal_id=goal_id), ctx)
        state = await self.service.load(goal_id)
        if recorded and state.worker_session_id is not None:
            try:
                await self.host.abort(state.worker_session_id)
            except HostError:
                pass
        if recorded:
            await self._cancel_awaits(goal_id, "goal paused", ctx.caused_by(recorded[-1].event_id))
        return recorded

    async def _cancel_awaits(self, goal_id: str, reason: str, ctx: Ctx) -> None:
        """A paused or cleared goal waits for no command any more (docs/reference/loopd.md#s2-5)."""
        await cancel_goal_awaits(
            self.service.store,
            goal_id,
            reason,
            causation_id=ctx.causation_id,
            correlation_id=ctx.correlation_id,
        )

    async def resume(self, goal_id: str, ctx: Ctx) -> tuple[list[Envelope], TurnReport | None]:
        """Resume a parked goal (same worker session) and start a turn if its worker is idle."""
        recorded = await self.service.execute(c.ResumeGoal(goal_id=goal_id), ctx)
        if not recorded:
            return recorded, None
        recorded += await self.ensure_worker(goal_id, ctx.caused_by(recorded[-1].event_id))
        return recorded, await self._owner_turn(goal_id, ctx.caused_by(recorded[-1].event_id))

    async def retry(self, goal_id: str, ctx: Ctx) -> tuple[list[Envelope], TurnReport | None]:
        """Retry a blocked goal: counters reset, then a turn (which applies a prepared fallback first)."""
        recorded = await self.service.execute(c.RetryGoal(goal_id=goal_id), ctx)
        if not recorded:
            return recorded, None
        recorded += await self.ensure_worker(goal_id, ctx.caused_by(recorded[-1].event_id))
        return recorded, await self._owner_turn(goal_id, ctx.caused_by(recorded[-1].event_id))

    async def _owner_turn(
        self, goal_id: str, ctx: Ctx, *, force: bool = False, kind: Kind = "steer"
    ) -> TurnReport:
        """The turn an owner action starts; a refused pending switch is its outcome, not an exception.

        The owner's own event is already recorded (and the refusal with its blocker), so the caller gets both
        back: raising here would lose what ``resume``/``retry`` recorded.
        """
        try:
            return await self.continue_turn(goal_id, ctx, explicit=True, force=force, kind=kind)
        except SwitchFailedError as e:
            return TurnReport(
                goal_id=goal_id, result="switch-failed", switches=[e.report], detail=e.report.message()
            )

    async def clear(self, goal_id: str, ctx: Ctx) -> list[Envelope]:
        """Abort the worker (best effort), then remove the goal; irreversible."""
        state = await self.service.load(goal_id)
        if state.exists and state.worker_session_id is not None:
            try:
                await self.host.abort(state.worker_session_id)
            except HostError:
                pass
        recorded = await self.service.execute(c.ClearGoal(goal_id=goal_id), ctx)
        if recorded:
            await self._cancel_awaits(goal_id, "goal cleared", ctx.caused_by(recorded[-1].event_id))
        return recorded

    async def set_interactive(self, goal_id: str, on: bool, ctx: Ctx) -> list[Envelope]:
        """Manual mode on (the engine starts no turns of its own) or off."""
        return await self.service.execute(c.SetInteractive(goal_id=goal_id, interactive=on), ctx)

    # -- identity -------------------------------------------------------------------------------------

    async def switch_identity(
        self,
        goal_id: str,
        ctx: Ctx,
        *,
        model: str | None = None,
        agent: str | None = None,
        resume: bool = False,
    ) -> SwitchReport:
        """Switch the goal's model and/or agent: unsupported, deferred (pending), or run through the saga.

        :raises RuleError: for a request the rules refuse (nothing recorded).
        """
        switch_id = new_event_id()
        command = c.SwitchIdentity(
            goal_id=goal_id,
            caller=self.service.owner,
            switch_id=switch_id,
            model=model,
            agent=agent,
            resume=resume,
        )
        recorded = await self.service.execute(command, ctx)
        state = await self.service.load(goal_id)
        first = recorded[0]
        if first.type == "identity.switch_requested":
            report = await self.switches.start(first, ctx)
            if report.resumed:
                await self.continue_turn(goal_id, ctx, explicit=True)
            await self.run_requested(goal_id, ctx)  # a turn the owner asked for meanwhile
            return report
        outcome: Literal["deferred", "unsupported"] = (
            "deferred" if first.type == "identity.switch_deferred" else "unsupported"
        )
        data = first.data_dict()
        return SwitchReport(
            goal_id=goal_id,
            switch_id=switch_id,
            outcome=outcome,
            model=data.get("model") or state.config.model,
            agent=data.get("agent") or state.config.agent,
        )

    async def apply_pending(self, goal_id: str, ctx: Ctx) -> list[SwitchReport]:
        """Apply pending switches (pair, then model, then agent) on a confirmed idle worker
        (docs/reference/loopd.md#s3-2 step 5).

        :raises SwitchFailedError: when one is refused; the goal is then blocked (once) with the reference's text.
        """
        reports: list[SwitchReport] = []
        for _ in range(3):
            recorded = await self.service.execute(
                c.ApplyPendingSwitch(goal_id=goal_id, switch_id=new_event_id()), ctx
            )
            if not recorded:
                break
            first = recorded[0]
            if first.type == "identity.switch_requested":
                report = await self.switches.start(first, ctx)
            else:  # the catalog refused it: the decider recorded the failure and the blocker
                data = first.data_dict()
                report = SwitchReport(
                    goal_id=goal_id,
                    switch_id=data["switch_id"],
                    outcome="failed",
                    pending=True,
                    target=data.get("target", "identity"),
                )
            reports.append(report)
            if not report.ok:
                raise SwitchFailedError(report)
        return reports

    # -- turns ----------------------------------------------------------------------------------------

    async def continue_turn(
        self, goal_id: str, ctx: Ctx, *, explicit: bool, force: bool = False, kind: Kind = "steer"
    ) -> TurnReport:
        """Start the goal's next turn if it may run (docs/reference/loopd.md#s3-2): pendings first, then
        prompt.

        ``explicit`` marks an owner action; without it an interactive goal is never prompted.

        :raises SwitchFailedError: when a pending switch is refused; the goal is then blocked.
        """
        return await self.turns.continue_turn(goal_id, ctx, explicit=explicit, force=force, kind=kind)

    async def idle(self, goal_id: str, ctx: Ctx) -> TurnReport:
        """The worker went idle: count the turn's usage, confirm the run, enforce limits, and (unless
        interactive) continue, as the engine's idle confirmation does.

        The usage goes in the confirmation's commit, before any next turn is decided: it used to be counted
        only while that turn's prompt was built, so a goal past its token budget got one more turn. A worker
        its host reports busy has not finished its turn, so nothing is recorded then.
        """
        state = await self.service.load(goal_id)
        if state.exists and state.phase == "running" and state.active_run_id is not None:
            worker = state.worker_session_id
            if worker is not None and await self.host.session_status(worker) == "busy":
                return TurnReport(goal_id=goal_id, result="busy", detail="turn-not-over")
            transcript = None
            if worker is not None and self.turns.transcripts is not None:
                messages = await self.turns.recent(worker)
                transcript = Transcript(worker, messages)
            confirm = c.ConfirmIdle(
                goal_id=goal_id, run_id=state.active_run_id, generation=state.run_generation
            )
            usage = usage_of(goal_id, transcript.messages[-USAGE_WINDOW:]) if transcript else []
            recorded, report = await self.turns.confirm_and_start(goal_id, [*usage, confirm], ctx, transcript)
            if report is not None:
                return report
            if recorded:
                ctx = ctx.caused_by(recorded[-1].event_id)
            state = await self.service.load(goal_id)
        now = self.service.clock.now()
        if state.exists and state.phase == "waiting_retry" and state.retry_after is not None:
            if now < state.retry_after and not state.interactive:
                return TurnReport(goal_id=goal_id, result="waiting", detail=stamp(state.retry_after))
        return await self.continue_turn(goal_id, ctx, explicit=False)

    async def compact(self, goal_id: str, ctx: Ctx) -> list[SwitchReport]:
        """Compaction (docs/reference/loopd.md#s3-14): apply pending switches first, then compact with the
        (new) model."""
        state = await self.service.load(goal_id)
        worker = state.worker_session_id
        if not state.exists or state.status != "active" or worker is None:
            return []
        if await self.host.session_status(worker) != "idle":
            return []
        has_pending = bool(state.pending_identity or state.model_pending or state.agent_pending)
        reports = await self.apply_pending(goal_id, ctx) if has_pending else []
        state = await self.service.load(goal_id)
        try:
            await self.host.compact(worker, model=state.config.model)
        except HostError:
            pass  # the reference swallows compaction errors
        return reports

    # -- provider errors ------------------------------------------------------------------------------

    async def observe_error(
        self,
        goal_id: str,
        error: Any,
        ctx: Ctx,
        *,
        source: Source = "session-error",
        expected_model: str | None = None,
        run_id: str | None = None,
        generation: int | None = None,
        via: str | None = None,
    ) -> list[Envelope]:
        """A provider error as the host reported it: run failure, classification, fallback preparation.

        ``run_id``/``generation``: the run the error was seen on; an error of an earlier run fails nothing.
        """
        return await observe_provider_error(
            self.service,
            goal_id,
            error,
            ctx,
            source=source,
            expected_model=expected_model,
            run_id=run_id,
            generation=generation,
            via=via,
        )


def make_artifact_dir(state: GoalState) -> None:
    """Make the goal's artifact directory, where its progress file lives and its checks run by default (the
    reference makes it when the goal starts; a check in a missing directory fails every completion)."""
    if state.config.artifact_dir:
        os.makedirs(state.config.artifact_dir, exist_ok=True)
