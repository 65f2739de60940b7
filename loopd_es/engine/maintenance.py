"""The maintenance pass (docs/reference/loopd.md#s3-22), every ``maintenance_ms`` of the engine's clock.

For each active goal with a worker: the mid-turn budget stop first (interactive goals too), then for
non-interactive goals a due retry, tool-call TTL, and the status poll with its watchdogs: unknown-status
counting with one unreachable notice, idle recovery of a wedged running phase (fenced on the run's
generation), the idle-unconfirmed and busy-stuck watchdogs (one ``run.stuck`` and one notice per run), and
the poll-driven continuation of an idle goal. Every decision is an event; notices go through the outbox,
keyed by the event that caused them. The reference's terminal-leak and stale-run repairs have nothing to do
here: every event that parks a goal or clears its run releases the lease in the same fold.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Literal

from ..app.service import Ctx
from ..clock import ms_between
from ..domain import goal_commands as c
from ..domain.decide import decide
from ..domain.rules import run_in_time
from ..domain.streams import goal_stream
from ..host.errors import HostError
from .shares import GoalLostError

if TYPE_CHECKING:
    from ..app.turns import Guard
    from ..clock import Clock
    from ..domain.state import GoalState
    from ..host.events import EngineHost
    from ..log.base import LogStore
    from .config import EngineConfig
    from .live import Live, Tracker
    from .ports import GoalLog, IdleSignal, Notifier, Switches, TurnDriver


@dataclass
class Maintenance:
    """One engine's maintenance pass, over the collaborators it uses (never the engine itself)."""

    goals: GoalLog
    turns: TurnDriver
    idle: IdleSignal
    switches: Switches
    notifier: Notifier
    host: EngineHost
    tracker: Tracker
    clock: Clock
    config: EngineConfig
    store: LogStore
    """Read only: the goal's latest event, the cause of a notice no single event caused."""
    owns: Callable[[str], bool]
    guard: Guard
    due_schedules: Callable[[datetime], Awaitable[int]] | None = None
    """The scheduling issue's hook: called on each pass with the engine's time."""

    async def run(self) -> None:
        if self.due_schedules is not None:
            await self.due_schedules(self.clock.now())
        for goal_id in list(self.tracker.goals):
            if not self.owns(goal_id):
                continue
            try:
                state = await self.goals.load(goal_id)
                if state.exists and state.status == "active" and state.worker_session_id is not None:
                    await self.goal(state, self.tracker.live(goal_id))
            except GoalLostError:
                continue  # a shared engine lost the goal meanwhile: its new holder maintains it
        await self.notifier.deliver()

    async def goal(self, state: GoalState, live: Live) -> None:
        now = self.clock.now()
        ctx = Ctx.new()
        if state.switch_in_flight is not None:
            # a switch whose process died mid host call (Ctrl-C at the wrong moment) is settled from the
            # host's truth here, within one maintenance period, not only at the next engine start
            if await self.switches.recover(ctx, only=state.goal_id):
                return
        elif state.turn_requested is not None:  # its switch ended in a process that stopped before the turn
            await self.switches.run_requested(state.goal_id, ctx)
            return
        if await self.budget(state, ctx):
            return
        if state.interactive:
            return
        goal_id, worker = state.goal_id, state.worker_session_id
        assert worker is not None
        if state.phase == "waiting_retry":
            if state.retry_after is None or now >= state.retry_after:
                await self.turns.continue_goal(goal_id, ctx)
            return
        if state.phase == "compacting":
            # the engine compacts within one step, so a compaction still open here was cut by a crash
            cut = c.CompleteCompaction(goal_id=goal_id, error="interrupted (the engine stopped)")
            await self.goals.execute(cut, ctx)
            return
        if state.phase not in ("running", "idle"):
            return
        if (
            live.tools
            and live.last_activity is not None
            and ms_between(now, live.last_activity) > self.config.tool_ttl_ms
        ):
            live.tools.clear()
            live.candidate_at, live.candidate_generation = None, None
        status = await self.host.session_status(worker)
        if status == "unknown":
            await self.unknown(state, live, ctx)
            return
        live.unknown_count, live.unreachable_notified = 0, False
        live.status = status
        if status == "idle":
            if state.phase == "running":
                if await self.recover(state, live, now, ctx) or await self.idle_stuck(state, live, now, ctx):
                    return
                await self.idle.on_idle(goal_id)
            else:
                await self.turns.continue_goal(goal_id, ctx)
            return
        await self.busy_stuck(state, live, now, status, ctx)

    async def budget(self, state: GoalState, ctx: Ctx) -> bool:
        """G17: over budget mid-turn: abort the worker first, then record the stop and tell the owner."""
        command = c.EnforceBudget(goal_id=state.goal_id)
        if not decide(command, state, c.Facts(now=self.clock.now())):
            return False
        assert state.worker_session_id is not None
        await self.guard(state.goal_id)
        try:  # the worker stops first; the stop is then decided again on the goal as it is now
            await self.host.abort(state.worker_session_id)
        except HostError:
            pass
        await self.goals.execute(command, ctx)
        return True  # the owner is told from the log (notices)

    async def unknown(self, state: GoalState, live: Live, ctx: Ctx) -> None:
        threshold = max(1, self.config.unknown_threshold)
        live.unknown_count = min(threshold, live.unknown_count + 1)
        if live.unknown_count >= threshold and not live.unreachable_notified:
            live.unreachable_notified = True
            text = (
                f'Loop goal "{state.name}" worker is unreachable after {live.unknown_count} status checks. The goal '
                "remains active; use inspect_background_goal, nudge_goal, pause_goal, or resume_goal to recover it."
            )
            cause = await self._last_event_id(state)
            await self.notifier.request(state, "unreachable", text, cause, ctx)

    async def recover(self, state: GoalState, live: Live, now: datetime, ctx: Ctx) -> bool:
        """Idle worker, running phase, quiet for ``idle_recover_ms``: release the run and continue.

        Quiet as this engine saw it: a turn taken over (a restart, an adoption) whose idle came before the
        engine listened is first confirmed the ordinary way, not recovered into an extra turn because its run
        started long ago."""
        since = live.quiet_since()
        if since is None or state.active_run_id is None:
            return False
        quiet = ms_between(now, since)
        if quiet <= self.config.idle_recover_ms:
            return False
        recover = c.RecoverRun(
            goal_id=state.goal_id,
            run_id=state.active_run_id,
            generation=state.run_generation,
            quiet_seconds=round(quiet / 1000, 3),
            cleared_tool_calls=len(live.tools),
        )
        await self.goals.execute(recover, ctx)
        live.tools.clear()
        await self.turns.continue_goal(state.goal_id, ctx)
        return True

    async def idle_stuck(self, state: GoalState, live: Live, now: datetime, ctx: Ctx) -> bool:
        """Idle worker whose turn will not confirm for ``idle_unconfirmed_ms``: one ``run.stuck``, one notice."""
        failed_at = live.confirm_failed_at
        if (
            state.confirm_failed_generation != state.run_generation
            or failed_at is None
            or state.active_run_id is None
            or state.stuck_notified_run_id == state.active_run_id
            or ms_between(now, failed_at) <= self.config.idle_unconfirmed_ms
        ):
            return False
        await self._stuck(state, ms_between(now, failed_at) / 1000, "idle-unconfirmed", ctx)
        return True

    async def busy_stuck(self, state: GoalState, live: Live, now: datetime, status: str, ctx: Ctx) -> None:
        """Busy worker, lease expired, no activity for ``stuck_running_ms``: one ``run.stuck``, one notice.

        As for :meth:`recover`, the quiet counts from the takeover at the earliest: the activity before it went
        to another engine (or to none)."""
        last = live.quiet_since()
        if (
            state.phase != "running"
            or state.active_run_id is None
            or state.stuck_notified_run_id == state.active_run_id
            or run_in_time(state, now)
            or last is None
            or ms_between(now, last) <= self.config.stuck_running_ms
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
        stuck_run = c.RecordStuck(
            goal_id=state.goal_id,
            run_id=state.active_run_id,
            generation=state.run_generation,
            stuck_seconds=round(stuck, 3),
            watchdog=watchdog,
            worker_status=status,
        )
        await self.goals.execute(stuck_run, ctx)

    async def _last_event_id(self, state: GoalState) -> str:
        """The id of the goal's latest event: the cause of a notice that no single event caused."""
        last = None
        async for env in self.store.read_stream(goal_stream(state.goal_id), from_version=state.version):
            last = env
        return last.event_id if last is not None else state.goal_id
