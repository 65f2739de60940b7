"""The maintenance pass (reference §3.22), every ``maintenance_ms`` of the engine's clock.

For each active goal with a worker: the mid-turn budget stop first (interactive goals too), then for
non-interactive goals a due retry, tool-call TTL, and the status poll with its watchdogs: unknown-status
counting with one unreachable notice, idle recovery of a wedged running phase (fenced on the run's
generation), the idle-unconfirmed and busy-stuck watchdogs (one ``run.stuck`` and one notice per run), and
the poll-driven continuation of an idle goal. Every decision is an event; notices go through the outbox,
keyed by the event that caused them. The reference's terminal-leak and stale-run repairs have nothing to do
here: every event that parks a goal or clears its run releases the lease in the same fold.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Literal

from ..app.service import Ctx
from ..clock import is_before, ms_between
from ..domain import goal_commands as c
from ..domain.decide import decide
from ..domain.rules import lease_valid
from ..events import engine as en
from ..events import run as r
from ..host.errors import HostError
from .shares import GoalLostError, acting_for

if TYPE_CHECKING:
    from ..domain.state import GoalState
    from .core import Engine
    from .live import Live


class Maintenance:
    """One engine's maintenance pass."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def run(self) -> None:
        engine = self.engine
        if engine.due_schedules is not None:
            await engine.due_schedules(engine.clock.now())
        for goal_id in list(engine.tracker.goals):
            if not engine.owns(goal_id):
                continue
            try:
                with acting_for(goal_id):
                    state = await engine.service.load(goal_id)
                    if state.exists and state.status == "active" and state.worker_session_id is not None:
                        await self.goal(state, engine.tracker.live(goal_id))
            except GoalLostError:
                continue  # a shared engine lost the goal meanwhile: its new holder maintains it
        await engine.outbox.deliver()

    async def goal(self, state: GoalState, live: Live) -> None:
        engine = self.engine
        now = engine.clock.now()
        ctx = Ctx.new()
        if state.switch_in_flight is not None:
            # a switch whose process died mid host call (Ctrl-C at the wrong moment) is settled from the
            # host's truth here, within one maintenance period, not only at the next engine start
            if await engine.goals.recover(ctx, only=state.goal_id):
                return
        elif state.turn_requested is not None:  # its switch ended in a process that stopped before the turn
            await engine.goals.run_requested(state.goal_id, ctx)
            return
        if await self.budget(state, ctx):
            return
        if state.interactive:
            return
        goal_id, worker = state.goal_id, state.worker_session_id
        assert worker is not None
        if state.phase == "waiting_retry":
            if not is_before(now, state.retry_after):
                await engine.continue_goal(goal_id, ctx)
            return
        if state.phase == "compacting":
            # the engine compacts within one step, so a compaction still open here was cut by a crash
            await engine.service.append_goal(
                goal_id,
                [en.CompactionCompleted(goal_id=goal_id, error="interrupted (the engine stopped)")],
                ctx,
                expected=state.version,
            )
            return
        if state.phase not in ("running", "idle"):
            return
        if (
            live.tools
            and live.last_activity is not None
            and ms_between(now, live.last_activity) > engine.config.tool_ttl_ms
        ):
            live.tools.clear()
            live.candidate_at, live.candidate_generation = None, None
        status = await engine.host.session_status(worker)
        if status == "unknown":
            await self.unknown(state, live, ctx)
            return
        live.unknown_count, live.unreachable_notified = 0, False
        live.status = status
        if status == "idle":
            if state.phase == "running":
                if await self.recover(state, live, now, ctx) or await self.idle_stuck(state, live, now, ctx):
                    return
                await engine.on_idle(goal_id)
            else:
                await engine.continue_goal(goal_id, ctx)
            return
        await self.busy_stuck(state, live, now, status, ctx)

    async def budget(self, state: GoalState, ctx: Ctx) -> bool:
        """G17: over budget mid-turn: abort the worker first, then record the stop and tell the owner."""
        engine = self.engine
        facts = c.Facts(now=engine.clock.now())
        events = decide(c.EnforceBudget(goal_id=state.goal_id), state, facts)
        if not events:
            return False
        assert state.worker_session_id is not None
        await engine.guard()
        try:
            await engine.host.abort(state.worker_session_id)
        except HostError:
            pass
        await engine.service.append_goal(state.goal_id, events, ctx, expected=state.version)
        return True  # the owner is told from the log (notices)

    async def unknown(self, state: GoalState, live: Live, ctx: Ctx) -> None:
        engine = self.engine
        threshold = max(1, engine.config.unknown_threshold)
        live.unknown_count = min(threshold, live.unknown_count + 1)
        if live.unknown_count >= threshold and not live.unreachable_notified:
            live.unreachable_notified = True
            text = (
                f'Loop goal "{state.name}" worker is unreachable after {live.unknown_count} status checks. The goal '
                "remains active; use inspect_background_goal, nudge_goal, pause_goal, or resume_goal to recover it."
            )
            cause = await self._last_event_id(state)
            await engine.outbox.request(state, "unreachable", text, cause, ctx)

    async def recover(self, state: GoalState, live: Live, now: datetime, ctx: Ctx) -> bool:
        """Idle worker, running phase, quiet for ``idle_recover_ms``: release the run and continue."""
        engine = self.engine
        marks = [m for m in (live.last_activity, live.run_started_at) if m is not None]
        if not marks or state.active_run_id is None:
            return False
        quiet = ms_between(now, max(marks))
        if quiet <= engine.config.idle_recover_ms:
            return False
        event = r.RunRecovered(
            goal_id=state.goal_id,
            run_id=state.active_run_id,
            quiet_seconds=round(quiet / 1000, 3),
            cleared_tool_calls=len(live.tools),
            generation=state.run_generation,
        )
        await engine.service.append_goal(state.goal_id, [event], ctx, expected=state.version)
        live.tools.clear()
        await engine.continue_goal(state.goal_id, ctx)
        return True

    async def idle_stuck(self, state: GoalState, live: Live, now: datetime, ctx: Ctx) -> bool:
        """Idle worker whose turn will not confirm for ``idle_unconfirmed_ms``: one ``run.stuck``, one notice."""
        engine = self.engine
        failed_at = live.confirm_failed_at
        if (
            state.confirm_failed_generation != state.run_generation
            or failed_at is None
            or state.active_run_id is None
            or state.stuck_notified_run_id == state.active_run_id
            or ms_between(now, failed_at) <= engine.config.idle_unconfirmed_ms
        ):
            return False
        await self._stuck(state, ms_between(now, failed_at) / 1000, "idle-unconfirmed", ctx)
        return True

    async def busy_stuck(self, state: GoalState, live: Live, now: datetime, status: str, ctx: Ctx) -> None:
        """Busy worker, lease expired, no activity for ``stuck_running_ms``: one ``run.stuck``, one notice."""
        engine = self.engine
        last = live.last_activity or live.run_started_at
        if (
            state.phase != "running"
            or state.active_run_id is None
            or state.stuck_notified_run_id == state.active_run_id
            or lease_valid(state, now)
            or last is None
            or ms_between(now, last) <= engine.config.stuck_running_ms
        ):
            return
        await self._stuck(state, ms_between(now, last) / 1000, "busy", ctx, status)

    async def _stuck(
        self,
        state: GoalState,
        stuck: float,
        watchdog: Literal["idle-unconfirmed", "busy"],
        ctx: Ctx,
        status: str | None = None,
    ) -> None:
        """One ``run.stuck`` for the run (its fold marks the run notified); the notice follows from the log."""
        assert state.active_run_id is not None
        await self.engine.service.append_goal(
            state.goal_id,
            [
                r.RunStuck(
                    goal_id=state.goal_id,
                    run_id=state.active_run_id,
                    stuck_seconds=round(stuck, 3),
                    watchdog=watchdog,
                    generation=state.run_generation,
                    worker_status=status,
                )
            ],
            ctx,
            expected=state.version,
        )

    async def _last_event_id(self, state: GoalState) -> str:
        """The id of the goal's latest event: the cause of a notice that no single event caused."""
        from ..domain.streams import goal_stream

        last = None
        async for env in self.engine.store.read_stream(
            goal_stream(state.goal_id), from_version=state.version
        ):
            last = env
        return last.event_id if last is not None else state.goal_id
