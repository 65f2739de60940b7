"""Every operation an owner or a worker has in the reference, as a Python API with the reference's messages.

Owner: create, pause, resume, retry, clear, nudge, send input, interactive on/off, force complete, force block,
abort worker. Worker (found by its session, among active or blocked goals): get goal, report progress,
complete (the goal's checks run as real commands), block. Each call decides on the goal's current state,
appends, and performs its host calls; turns it starts send the full steering prompt (:mod:`.turns`); notices
go through the outbox. They return a :class:`Result` whose ``message`` is what the reference says.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from ..app.goals import Goals, SwitchFailedError, TurnReport, make_artifact_dir
from ..app.service import Ctx, GoalService
from ..clock import Clock, SystemClock
from ..domain import goal_commands as c
from ..domain.rules import RuleError
from ..events.envelope import new_event_id
from ..host.errors import HostError
from .checks import run_checks
from .notices import notice_for
from .outbox import Outbox
from .tool_views import goal_structured

if TYPE_CHECKING:
    from ..app.goal_index import GoalIndex
    from ..app.goals import Goals
    from ..domain.state import GoalState
    from ..events.base import Caller
    from ..events.envelope import Envelope
    from ..host.events import EngineHost
    from ..log.base import LogStore


class Result(msgspec.Struct, kw_only=True):
    """What an operation did: ``ok``, the reference's ``message``, and details (``goal_id``, ``status`` ...)."""

    ok: bool = True
    message: str = ""
    goal_id: str | None = None
    status: str | None = None
    data: dict[str, Any] = msgspec.field(default_factory=dict)


class Operations:
    """The owner and worker operations over one log and one host."""

    def __init__(
        self,
        store: LogStore,
        host: EngineHost,
        *,
        clock: Clock | None = None,
        directory: str = ".",
        owner: str = "cli",
        index: GoalIndex | None = None,
        caller: Caller | None = None,
    ) -> None:
        self.caller = caller
        """The tool call these operations answer (``None`` from the CLI): recorded on the events it causes."""
        self.clock = clock or SystemClock()
        self.service = GoalService(
            store, host, clock=self.clock, directory=directory, owner=owner, index=index
        )
        self.host = host
        self.goals = Goals(self.service)
        self.turns = self.goals.turns
        self.outbox = Outbox(store, host, self.clock)
        self.directory = directory

    def _ctx(self) -> Ctx:
        return Ctx.new(self.caller)

    # -- owner ---------------------------------------------------------------------------------------

    async def create(self, name: str, objective: str, *, goal_id: str | None = None, **config: Any) -> Result:
        """``loopd_create_goal``: validate, record, create the worker, send the first turn (interactive too)."""
        goal_id = goal_id or str(uuid.uuid4())
        ctx = self._ctx()
        command = c.CreateGoal(
            goal_id=goal_id, name=name, objective=objective, owner_session_id=self.service.owner, **config
        )
        created = await self.service.execute(command, ctx)
        make_artifact_dir(await self.service.load(goal_id))
        assigned = await self.goals.ensure_worker(goal_id, ctx.caused_by(created[-1].event_id))
        if (refused := await self._worker_refused(goal_id, assigned, "Goal creation failed")) is not None:
            return refused
        if assigned:  # nothing when the goal was cleared meanwhile
            await self.turns.continue_turn(
                goal_id, ctx.caused_by(assigned[-1].event_id), explicit=True, force=True
            )
        state = await self.service.load(goal_id)
        return Result(
            message=f'Goal "{name}" created and started in the background. Artifacts: {state.config.artifact_dir}.',
            goal_id=goal_id,
            status=state.status,
        )

    async def _worker_refused(self, goal_id: str, recorded: list[Envelope], what: str) -> Result | None:
        """The answer when the host would not make the goal's worker (the goal is blocked, saying why)."""
        if not recorded or recorded[-1].type != "goal.blocked":
            return None
        state = await self.service.load(goal_id)
        detail = (
            state.blocker.reason if state.blocker is not None else "the host refused"
        )  # names model, agent
        return Result(ok=False, message=f"{what}: {detail}", goal_id=goal_id, status="blocked")

    async def pause(self, goal_id: str) -> Result:
        state = await self.service.load(goal_id)
        if state.exists and state.status == "paused":
            return Result(message=f'Goal "{state.name}" is already paused.', goal_id=goal_id, status="paused")
        await self.goals.pause(goal_id, self._ctx())
        state = await self.service.load(goal_id)
        return Result(
            message=f'Goal "{state.name}" paused. Resume with resume_goal.',
            goal_id=goal_id,
            status=state.status,
        )

    async def resume(self, goal_id: str) -> Result:
        """``resume_goal``: active → already active; paused (or parked) → resume; blocked → retry."""
        state = await self.service.load(goal_id)
        if state.exists and state.status == "active":
            return Result(message=f'Goal "{state.name}" is already active.', goal_id=goal_id, status="active")
        command: c.GoalCommand = (
            c.RetryGoal(goal_id=goal_id) if state.status == "blocked" else c.ResumeGoal(goal_id=goal_id)
        )
        return await self._restart(goal_id, command)

    async def retry(self, goal_id: str) -> Result:
        """Retry a blocked goal: failure, rejection and force-finish counters reset, then a turn."""
        return await self._restart(goal_id, c.RetryGoal(goal_id=goal_id))

    async def _restart(self, goal_id: str, command: c.GoalCommand) -> Result:
        """Record a resume or a retry, make the worker if none is recorded (docs/reference/loopd.md#s3-4), turn."""
        ctx = self._ctx()
        recorded = await self.service.execute(command, ctx)
        if recorded:
            made = await self.goals.ensure_worker(goal_id, ctx.caused_by(recorded[-1].event_id))
            name = (await self.service.load(goal_id)).name
            refused = await self._worker_refused(goal_id, made, f'Goal "{name}" could not start')
            if refused is not None:
                return refused
            cause = (made or recorded)[-1].event_id
            await self.turns.continue_turn(goal_id, ctx.caused_by(cause), explicit=True)
        state = await self.service.load(goal_id)
        return Result(message=f'Goal "{state.name}" resumed.', goal_id=goal_id, status=state.status)

    async def switch_identity(
        self, goal_id: str, *, model: str | None = None, agent: str | None = None, resume: bool = False
    ) -> Result:
        """docs/reference/loopd.md#s3-10: switch the worker's model and/or agent on the same session (deferred
        while it is busy)."""
        report = await self.goals.switch_identity(
            goal_id, self._ctx(), model=model, agent=agent, resume=resume
        )
        state = await self.service.load(goal_id)
        return Result(
            ok=report.ok,
            message=report.message(),
            goal_id=goal_id,
            status=state.status,
            data={
                "outcome": report.outcome,
                "resumed": report.resumed,
                "model": report.model,
                "agent": report.agent,
            },
        )

    async def inspect(self, goal_id: str) -> GoalState:
        """The goal's whole state, folded from its stream (``loopd-es goal show`` reads the read models)."""
        return await self.service.load(goal_id)

    async def clear(self, goal_id: str) -> Result:
        state = await self.service.load(goal_id)
        await self.goals.clear(goal_id, self._ctx())
        return Result(message=f'Goal "{state.name}" cleared and removed.', goal_id=goal_id)

    async def nudge(self, goal_id: str) -> Result:
        """docs/reference/loopd.md#s3-6: clear the run markers and force a full-steering turn (even on a busy
        worker).

        The answer says what happened: re-prompted, queued behind a switch in flight, or why not.
        """
        ctx = self._ctx()
        recorded = await self.service.execute(c.NudgeGoal(goal_id=goal_id), ctx)
        return await self._turn(
            goal_id,
            ctx.caused_by(recorded[-1].event_id),
            "steer",
            (
                'Re-prompted worker for "{name}".',
                'Turn queued for "{name}": an identity switch is being applied; the worker is re-prompted '
                "once it ends.",
                'Worker for "{name}" was not re-prompted: {why}.',
            ),
        )

    async def _turn(
        self, goal_id: str, ctx: Ctx, kind: Literal["steer", "bare"], said: tuple[str, str, str]
    ) -> Result:
        """An owner's forced turn and what it did, in ``said``'s words (started, queued behind a switch, or
        not, with ``{why}``); a refused pending switch is its outcome (the goal is blocked), not a raise."""
        try:
            turn = await self.turns.continue_turn(goal_id, ctx, explicit=True, force=True, kind=kind)
        except SwitchFailedError as e:
            turn = TurnReport(goal_id=goal_id, result="switch-failed", detail=e.report.message())
        state = await self.service.load(goal_id)
        index = {"started": 0, "queued": 1}.get(turn.result, 2)
        why = _why_not(turn, state) if index == 2 else ""
        ok = index < 2 or (kind == "bare" and turn.result not in ("prompt-failed", "switch-failed"))
        message = said[index].format(name=state.name, why=why)
        return Result(ok=ok, message=message, goal_id=goal_id, status=state.status)

    async def send(self, goal_id: str, text: str) -> Result:
        """docs/reference/loopd.md#s3-7: queue the owner's words; an active goal gets them at once as a bare
        turn of their own."""
        ctx = self._ctx()
        recorded = await self.service.execute(
            c.SendInput(goal_id=goal_id, input_id=new_event_id(), text=text), ctx
        )
        state = await self.service.load(goal_id)
        if state.status != "active":
            return Result(
                message=f'Queued for "{state.name}" (goal is {state.status}; delivers on the next active '
                "turn).",
                goal_id=goal_id,
                status=state.status,
            )
        if state.worker_session_id is None:
            return Result(
                message=f'Queued for "{state.name}" (no worker session yet; delivers on the next turn).',
                goal_id=goal_id,
                status=state.status,
            )
        return await self._turn(  # the words stay queued whatever happens to the turn
            goal_id,
            ctx.caused_by(recorded[-1].event_id),
            "bare",
            (
                'Sent to "{name}" as its own turn.',
                'Queued for "{name}" (an identity switch is being applied; delivers as its own turn once '
                "it ends).",
                'Queued for "{name}" (not delivered now: {why}).',
            ),
        )

    async def set_interactive(self, goal_id: str, on: bool) -> Result:
        await self.service.execute(c.SetInteractive(goal_id=goal_id, interactive=on), self._ctx())
        state = await self.service.load(goal_id)
        message = (
            f'Goal "{state.name}" is now manual: the engine will not start turns — steer it with :send/nudge.'
            if on
            else f'Goal "{state.name}" is back on auto: the engine resumes idle recovery and retries.'
        )
        return Result(message=message, goal_id=goal_id, status=state.status)

    async def force_complete(
        self, goal_id: str, summary: str | None = None, evidence: str | None = None
    ) -> Result:
        extra = {k: v for k, v in (("summary", summary), ("evidence", evidence)) if v}
        await self.service.execute(c.ForceComplete(goal_id=goal_id, **extra), self._ctx())
        state = await self.service.load(goal_id)
        return Result(message=f'Goal "{state.name}" force-completed.', goal_id=goal_id, status=state.status)

    async def force_block(self, goal_id: str, reason: str | None = None, needed: str | None = None) -> Result:
        extra = {k: v for k, v in (("reason", reason), ("needed", needed)) if v}
        await self.service.execute(c.ForceBlock(goal_id=goal_id, **extra), self._ctx())
        state = await self.service.load(goal_id)
        return Result(message=f'Goal "{state.name}" blocked.', goal_id=goal_id, status=state.status)

    async def abort_worker(self, goal_id: str) -> Result:
        """docs/reference/loopd.md#s3-19: abort the host session (best effort), release the run; status and
        session unchanged."""
        state = await self.service.load(goal_id)
        if state.exists and state.worker_session_id is not None:
            try:
                await self.host.abort(state.worker_session_id)
            except HostError:
                pass
        await self.service.execute(c.AbortWorker(goal_id=goal_id), self._ctx())
        state = await self.service.load(goal_id)
        message = f'Worker run for "{state.name}" aborted, session kept for inspection (status unchanged: {state.status}).'
        if state.status == "active":
            message += " Engine continues the same session next turn."
        return Result(message=message, goal_id=goal_id, status=state.status)

    # -- worker --------------------------------------------------------------------------------------

    async def worker_goal(self, session_id: str) -> GoalState | None:
        """The active or blocked goal whose worker is ``session_id``."""
        states = await self.service.goals_of_worker(session_id)
        for state in states:
            if state.status in ("active", "blocked"):
                return state
        return states[0] if states else None  # a paused one answers with its own message

    async def get_goal(self, session_id: str) -> Result:
        state = await self.worker_goal(session_id)
        if state is None or state.status not in ("active", "blocked"):
            return Result(ok=False, message="No active goal found for this worker session.", status="none")
        return Result(goal_id=state.goal_id, status=state.status, data=goal_structured(state))

    async def report_progress(
        self, session_id: str, summary: str, next: str | None = None, evidence: str | None = None
    ) -> Result:
        state = await self._worker_state(session_id)
        await self.service.execute(
            c.ReportProgress(goal_id=state.goal_id, summary=summary, next=next, evidence=evidence),
            self._ctx(),
        )
        return Result(message="Progress recorded.", goal_id=state.goal_id, status="active")

    async def complete(self, session_id: str, summary: str, evidence: str) -> Result:
        """``complete_goal``: run the checks; all pass → complete (owner told); else rejection (free retry)."""
        state = await self._worker_state(session_id, missing="No active goal to complete.")
        if state.status != "active":
            raise RuleError(f"Cannot complete goal in {state.status} state.")
        cfg = state.config
        cwd = cfg.check_cwd or cfg.artifact_dir or self.directory
        results = await run_checks(cfg.checks, cwd) if cfg.checks else []
        ctx = self._ctx()
        recorded = await self.service.execute(
            c.CompleteGoal(
                goal_id=state.goal_id,
                summary=summary,
                evidence=evidence,
                attempt_id=new_event_id(),
                check_results=tuple(results),
                cwd=cwd,
            ),
            ctx,
        )
        after = await self._tell(state.goal_id, recorded, ctx)
        failed = [r for r in results if r.exit_code != 0]
        if not failed:
            return Result(
                message=f'Goal "{after.name}" complete.',
                goal_id=state.goal_id,
                status=after.status,
                data={"goal_name": after.name, "summary": summary, "evidence": evidence},
            )
        blocked = after.status == "blocked"
        message = (
            "Evaluator rejection limit reached. Goal blocked; owner retry required."
            if blocked
            else "Evaluator rejected completion. Fix the issues above and try again."
        )
        return Result(
            ok=False,
            message=message,
            goal_id=state.goal_id,
            status=after.status,
            data={
                "goal_name": after.name,
                "passed": False,
                "rejection_count": after.evaluator_rejection_count,
                "failed_checks": [msgspec.to_builtins(r) for r in failed],
            },
        )

    async def block(self, session_id: str, reason: str, needed: str) -> Result:
        state = await self._worker_state(session_id, blocked_message=True)
        ctx = self._ctx()
        recorded = await self.service.execute(
            c.BlockGoal(goal_id=state.goal_id, reason=reason, needed=needed), ctx
        )
        after = await self._tell(state.goal_id, recorded, ctx)
        return Result(message=f'Goal "{after.name}" blocked.', goal_id=state.goal_id, status=after.status)

    async def _tell(self, goal_id: str, recorded: list[Envelope], ctx: Ctx) -> GoalState:
        """Tell the owner at once what ``recorded`` calls for (a running engine would too, under the same id)."""
        state = await self.service.load(goal_id)
        for env in recorded:
            found = notice_for(env, state)
            if found is not None:
                await self.outbox.request(state, found[0], found[1], env.event_id, ctx)
        return state

    async def _worker_state(
        self,
        session_id: str,
        *,
        missing: str = "No active goal to report progress for.",
        blocked_message: bool = False,
    ) -> GoalState:
        state = await self.worker_goal(session_id)
        if state is None or state.status not in ("active", "blocked"):
            raise RuleError(missing)
        if state.status == "blocked" and blocked_message:
            raise RuleError("Cannot block goal in blocked state.")
        return state


def _why_not(turn: TurnReport, state: GoalState) -> str:
    """Why an owner's forced turn did not start, in the words of what the goal is doing."""
    if turn.result == "prompt-failed":
        return f"the prompt was not delivered ({state.last_error or 'host error'})"
    if turn.result == "switch-failed":
        return f"the pending identity switch was refused and the goal is blocked ({turn.detail})"
    if turn.result == "busy":
        return "its worker is busy and an identity switch is pending; both wait for the worker to be idle"
    if turn.result == "running":
        return "a turn is already running"
    if turn.result == "no-worker":
        return "the goal has no worker session"
    return f"the goal is {state.status}"
