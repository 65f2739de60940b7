"""The engine: reacts to host events, to the log and to its timers, and records every decision as an event.

One :class:`Engine` handles one item at a time (a host event, a due timer, a maintenance pass), then catches
up with the log, which is how it learns what it and everyone else wrote: the tracker and the timers are only
ever updated from the log, in log order, so a restarted engine that reads the log rebuilds them exactly.

The turn loop follows docs/reference/loopd.md#s2-3 and docs/reference/loopd.md#s3-13: a turn whose end the
transcript proves is confirmed at its
first idle signal; otherwise that signal stages a candidate (``run.idle_candidate``, fenced by the run's
generation), and a second one at least ``confirm_idle_ms`` later confirms it against the transcript (or the
completion event already seen) - see :mod:`.idle`. Usage is accounted by message id, limits are enforced
(``run.completed`` + force finish / block / budget stop), then compaction or the next turn. An interactive
goal never gets a turn the engine started: every idle signal - ``session.idle`` or a status of ``idle`` -
goes through the same gate.

The engine wires its parts (the idle gate, the await waker, maintenance, command notices, and in shared mode the
balance pass), each given the narrow protocols of :mod:`.ports` rather than the engine, and changes goals only
through goal commands decided by :func:`~loopd_es.domain.decide.decide`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Final

from ..app.goals import Goals, SwitchFailedError, TurnReport
from ..app.service import Ctx, GoalService
from ..app.turns import Guard, Kind, Transcript, follow_up, no_guard
from ..clock import Clock, from_ms, ms_between, parse_rfc3339
from ..domain import goal_commands as c
from ..domain.streams import aggregate_of, goal_stream
from ..errors import StreamNotFoundError
from ..host.errors import HostError
from ..host.events import (
    AnyHostEvent,
    ExecutionSucceeded,
    MessagePartUpdated,
    MessageUpdated,
    SessionError,
    SessionIdle,
    SessionStatusChanged,
    ToolCallEnded,
    ToolCallStarted,
)
from ..procs.paths import CommandPaths
from .awaits import AwaitWaker
from .command_notices import COMMAND_NOTICE_TYPES, COMMAND_TYPES, CommandNotices
from .config import EngineConfig as EngineConfig
from .goal_fence import UnfencedWriteError
from .idle import IdleGate
from .idle_rules import may_end_turn
from .live import Live, Tracker, after
from .maintenance import Maintenance
from .notices import NOTICE_TYPES, notice_for
from .outbox import STREAM as NOTIFICATIONS
from .outbox import Outbox
from .shares import GoalLostError, Shares, preferred

if TYPE_CHECKING:
    from ..domain.state import GoalState
    from ..events.envelope import Envelope
    from ..host.events import EngineHost, TranscriptMessage
    from ..log.base import LogStore

log = logging.getLogger("loopd_es.engine")

ENGINE_TYPES: Final = (
    "goal.worker_assigned",
    "goal.cleared",
    "goal.input_queued",
    "run.started",
    "run.idle_candidate",
    "run.confirm_failed",
    "run.failed",
    "run.fell_back",
    "command.await-fired",
    "command.await-discarded",
    "notification.requested",
    "notification.delivered",
    "notification.undeliverable",
    *sorted(NOTICE_TYPES),
    *COMMAND_TYPES,
)
"""The events the engine's trackers, timers, reactions and outbox are built from."""


class Engine:
    """Runs goals on one log and one host; see the module docstring."""

    def __init__(
        self,
        store: LogStore,
        host: EngineHost,
        clock: Clock,
        config: EngineConfig | None = None,
        *,
        directory: str = ".",
        owner: str = "engine",
        guard: Guard | None = None,
        shares: Shares | None = None,
        store_url: str | None = None,
    ) -> None:
        self.store = store
        self.shares = shares
        """Shared mode (``loopd-es run --shared``): the goals this member holds; ``None`` when it runs them all."""
        self.read_types = ENGINE_TYPES
        self.host = host
        self.clock = clock
        self.config = config or EngineConfig()
        fence_for = shares.fence_for if shares is not None else None
        self.service = GoalService(
            store, host, clock=clock, directory=directory, owner=owner, fence_for=fence_for
        )
        self.guard = guard or no_guard
        self.goals = Goals(self.service, self.guard)
        self.turns = self.goals.turns
        self.outbox = Outbox(
            store,
            host,
            clock,
            self.guard,
            owns=self.owns,
            owns_command=self.owns_command,
            fence_for=fence_for,
        )
        self.commands = CommandNotices(store, self.outbox, CommandPaths(store_url) if store_url else None)
        """Notices to the sessions that started commands; ``store_url`` locates their output logs."""
        self.tracker = Tracker()
        self.position = 0
        self.next_maintenance: datetime | None = None
        self._reactions: list[Envelope] = []
        # the parts, each given the few collaborators it uses (:mod:`.ports`); the engine passes itself only as
        # the turn flow they may drive (:class:`.ports.TurnDriver`)
        self.awaits = AwaitWaker(self.service, self)
        self.idle = IdleGate(
            self.service, self, host, self.tracker, clock, confirm_idle_ms=self.config.confirm_idle_ms
        )
        self.maintenance = Maintenance(
            goals=self.service,
            turns=self,
            idle=self.idle,
            switches=self.goals,
            notifier=self.outbox,
            host=host,
            tracker=self.tracker,
            clock=clock,
            config=self.config,
            store=store,
            owns=self.owns,
            guard=self.guard,
        )

    @property
    def due_schedules(self) -> Callable[[datetime], Awaitable[int]] | None:
        """The scheduling issue's hook: called on each maintenance pass with the engine's time."""
        return self.maintenance.due_schedules

    @due_schedules.setter
    def due_schedules(self, hook: Callable[[datetime], Awaitable[int]] | None) -> None:
        self.maintenance.due_schedules = hook

    def owns(self, goal_id: str) -> bool:
        """Whether this engine acts for the goal: always, unless it is one member of a shared group."""
        return self.shares is None or self.shares.owns(goal_id)

    def owns_command(self, command_id: str) -> bool:
        """Whether this engine delivers the command's notices: always, unless a shared group prefers another
        live member for it (a command belongs to no goal, so no claim decides)."""
        shares = self.shares
        if shares is None:
            return True
        return shares.alive() and preferred(command_id, shares.live_members()) == shares.member

    # -- the log -------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Read the whole log (trackers, timers, outbox), then repair what a crash left half done."""
        await self.catch_up(react=False)  # first finish turns a crash interrupted, then replay reactions
        if self.shares is not None:  # a member holds nothing yet: each goal is recovered when claimed (adopt)
            self._reactions = [e for e in self._reactions if e.type in COMMAND_NOTICE_TYPES]
            self.next_maintenance = self.clock.now()
            return
        ctx = Ctx.new()
        await self.goals.recover(ctx)  # identity switches a crash left open, settled from the host's truth
        for goal_id in list(self.tracker.goals):
            state = await self.service.load(goal_id)
            if state.exists and state.status == "active" and state.phase == "running":
                self.tracker.live(goal_id).watched_since = self.clock.now()
                await self.turns.resend(goal_id, ctx)
        await self.outbox.deliver()
        self.next_maintenance = self.clock.now()
        await self.catch_up()

    async def catch_up(self, *, react: bool = True) -> int:
        """Observe every event appended since the last look, then run the reactions they call for.

        Only the event types the engine acts on are read: the log filters them, so other facts cost a scan of
        their rows, not a decode.
        """
        seen = 0
        async for env in self.store.read_all(self.position + 1, types=self.read_types):
            self._observe(env)
            self.position = env.position
            seen += 1
        while react and self._reactions:
            pending, self._reactions = self._reactions, []
            for env in pending:
                try:
                    await self._react(env)
                except GoalLostError as e:  # a shared engine lost the goal meanwhile: its new holder reacts
                    log.info("%s", e)
            seen += await self.catch_up()
        return seen

    async def _react(self, env: Envelope) -> None:
        if env.type in NOTICE_TYPES:
            await self.notice(env)
            return
        if env.type in COMMAND_NOTICE_TYPES:
            await self.commands.react(env)
            return
        goal_id = env.data_dict().get("goal_id")
        if not isinstance(goal_id, str) or self.owns(goal_id):
            await self.awaits.react(env)
        else:
            self.awaits.defer(env)

    def _observe(self, env: Envelope) -> None:
        if env.stream == NOTIFICATIONS:
            self.outbox.observe(env)
            return
        if env.type in COMMAND_TYPES:
            if self.commands.observe(env):
                self._reactions.append(env)
            return
        if env.type in ("command.await-fired", "command.await-discarded"):
            self._reactions.append(env)
            return
        goal_id = self.tracker.observe(env)
        if goal_id is None:
            return
        if env.type in NOTICE_TYPES:
            self._reactions.append(env)
        if env.type == "goal.input_queued":
            self.awaits.observe_queued(env.data_dict().get("input_id", ""))
        if env.type in ("run.failed", "run.fell_back"):  # a fallback turn's next turn is due at once ("at")
            retry_after = env.data_dict().get("retry_after" if env.type == "run.failed" else "at")
            if retry_after:
                self.tracker.schedule(goal_id, "retry", parse_rfc3339(retry_after))
        elif env.type == "run.idle_candidate":
            live = self.tracker.live(goal_id)
            if live.candidate_at is not None:
                self.tracker.schedule(
                    goal_id, "confirm", after(live.candidate_at, self.config.confirm_idle_ms)
                )

    # -- host events ---------------------------------------------------------------------------------

    async def on_host_event(self, event: AnyHostEvent) -> bool:
        """React to one host event; ``False`` when it concerns no active goal of this log (ignored)."""
        goal_id = self.tracker.goal_of_session(event.session_id)
        if goal_id is None:  # a worker created a moment ago by another process: look at the log first
            await self.catch_up()
            goal_id = self.tracker.goal_of_session(event.session_id)
        if goal_id is None or not self.owns(goal_id):
            return False
        try:
            return await self._on_goal_event(goal_id, event)
        except GoalLostError as e:  # a shared engine lost the goal meanwhile: its new holder goes on
            log.info("%s", e)
            return False

    async def _on_goal_event(self, goal_id: str, event: AnyHostEvent) -> bool:
        state = await self.service.load(goal_id)
        if not state.exists or state.status != "active":
            return False
        await self.guard(goal_id)
        live = self.tracker.live(goal_id)
        now = self.clock.now()
        handled = True
        stale, live.proven = live.proven, False
        if isinstance(event, SessionIdle) or (
            isinstance(event, SessionStatusChanged) and event.status == "idle"
        ):
            # OpenCode's idle pair (a status of idle, then session.idle) is one signal: when its first half
            # proved and confirmed the turn, the second is stale (it would stage the next run's candidate)
            repeated = stale and isinstance(event, SessionIdle) and live.status == "idle"
            live.status = "idle"
            handled = repeated or await self.on_idle(goal_id)
            if state.phase == "waiting_retry":  # a due turn (a fallback's) may have met a busy worker
                await self._retry_timer(goal_id)
        elif isinstance(event, SessionStatusChanged):
            live.status = event.status
            live.activity(now)
            if event.status == "retry":
                await self._retrying(state, event)
        elif isinstance(event, SessionError):
            await self._session_error(state, event)
        elif isinstance(event, MessageUpdated):
            handled = await self._message(state, live, event, now)
        elif isinstance(event, MessagePartUpdated):
            # a part of the running answer is work, unless that answer already completed (trailing parts)
            handled = (
                state.phase == "running"
                and event.message_id == live.assistant_id
                and live.assistant_completed_at is None
            )
            if handled:
                live.activity(now)
        elif isinstance(event, ExecutionSucceeded):
            handled = state.phase == "running"
            if handled:
                live.activity(now)
                live.assistant_completed_at = now
        elif isinstance(event, ToolCallStarted):
            live.tools[event.call_id] = now
            live.activity(now)
        elif isinstance(event, ToolCallEnded):
            live.tools.pop(event.call_id, None)
            live.activity(now)
        await self.catch_up()
        return handled

    async def _message(self, state: GoalState, live: Live, event: MessageUpdated, now: datetime) -> bool:
        """Correlate a message with the running turn (docs/reference/loopd.md#s2-3 activity rules); account a
        completed answer."""
        m = event.message
        prompt = state.active_prompt_message_id
        if state.phase != "running" or prompt is None:
            return False
        if m.role == "user":
            if m.message_id != prompt:
                return False
            live.activity(now)
            return True
        if m.parent_id != prompt:
            return False
        if live.assistant_completed_at is not None and m.message_id == live.assistant_id and not m.completed:
            return False  # trailing parts after completion are not work
        live.assistant_id = m.message_id
        live.activity(now)
        if m.completed:
            live.assistant_completed_at = now
            if not may_end_turn(m):
                await self.turns.account(state.goal_id, [m], Ctx.new())
            # else the answer that may end the turn: the idle right behind it (OpenCode sends it within a
            # millisecond) confirms the turn, and the confirmation counts this usage in its own commit, so no
            # commit of its own sits between the idle and the next prompt. A turn that does not confirm counts
            # it from the transcript later (the quiet period's read, the next prompt's quotes).
        return True

    async def _retrying(self, state: GoalState, event: SessionStatusChanged) -> None:
        """Early fallback: the host is retrying by itself (OpenCode: ~90 s, or five times a long Retry-After,
        before it reports the error), whatever the provider's words. A goal with an unused fallback model does
        not wait: it aborts the turn and records the limit, seen on the retry status; the turn ends as a
        fallback turn and the next goes out at once on the fallback model, on the same session."""
        worker, model = state.worker_session_id, state.config.model
        if state.phase != "running" or worker is None:
            return
        attempted = set(state.model_fallback.attempted if state.model_fallback else ()) | {model}
        if not any(m not in attempted for m in state.config.fallback_models):
            return
        reported: dict[str, object] = {"message": event.message or "", "attempt": event.attempt}
        if event.next_at_ms is not None:  # OpenCode's next attempt: the provider's Retry-After, recovered
            reported["retryAfter"] = max(0.0, ms_between(from_ms(event.next_at_ms), self.clock.now()) / 1000)
        try:
            await self.host.abort(worker)
        except HostError:
            return  # the host's own error will come through the session error path
        await self.goals.observe_error(
            state.goal_id,
            reported,
            Ctx.new(),
            source="session-error",
            expected_model=model,
            run_id=state.active_run_id,
            generation=state.run_generation,
            via="retry-status",
        )

    async def _session_error(self, state: GoalState, event: SessionError) -> None:
        await self.goals.observe_error(
            state.goal_id, event.error, Ctx.new(), source="session-error", expected_model=state.config.model
        )

    async def notice(self, env: Envelope) -> None:
        """Record (once) and deliver the notice a goal event calls for (:mod:`.notices`)."""
        _, goal_id = aggregate_of(env.stream)
        if not self.owns(goal_id):
            return  # its holder records it (an adopter replays the goal's notices when it claims the goal)
        await self._notice(goal_id, env)

    async def _notice(self, goal_id: str, env: Envelope) -> None:
        state = await self.service.load(goal_id)
        found = notice_for(env, state) if state.exists else None
        if found is None:
            return
        kind, text = found
        if self.outbox.known(f"{env.event_id}:{kind}"):
            return
        await self.outbox.request(
            state, kind, text, env.event_id, Ctx(env.correlation_id or env.event_id, env.event_id)
        )

    # -- the two-stage idle --------------------------------------------------------------------------

    async def on_idle(self, goal_id: str) -> bool:
        """An idle signal for the goal's worker (an event or a status poll): see :mod:`.idle`."""
        return await self.idle.on_idle(goal_id)

    async def after_confirm(
        self, goal_id: str, recorded: list[Envelope], ctx: Ctx, transcript: Transcript | None = None
    ) -> None:
        """docs/reference/loopd.md#s3-13 after ``run.completed``: the force-finish turn, compaction, or the
        next turn."""
        step = follow_up(await self.service.load(goal_id), {e.type for e in recorded})
        if step == "compact":
            await self.compact(goal_id, ctx)
        elif step != "stop":  # stopped: blocked (the owner is told from the log, see notice) or out of budget
            await self.continue_goal(goal_id, ctx, kind=step, transcript=transcript)

    async def confirm_turn(
        self, goal_id: str, confirm: Sequence[c.GoalCommand], ctx: Ctx, transcript: Transcript | None
    ) -> None:
        """Record a confirmed run, with the next run's start in the same commit when a plain turn follows
        (:meth:`.TurnStarter.confirm_and_start`); else what :meth:`after_confirm` does after the confirmation."""
        confirmed, report = await self.turns.confirm_and_start(goal_id, confirm, ctx, transcript)
        if confirmed and report is None:
            await self.after_confirm(goal_id, confirmed, ctx.caused_by(confirmed[-1].event_id), transcript)

    async def continue_goal(
        self,
        goal_id: str,
        ctx: Ctx,
        *,
        explicit: bool = False,
        force: bool = False,
        kind: Kind = "steer",
        transcript: Transcript | None = None,
    ) -> TurnReport | None:
        """The next turn, if the goal may have one; a refused pending switch has blocked the goal (``None``)."""
        try:
            return await self.turns.continue_turn(
                goal_id, ctx, explicit=explicit, force=force, kind=kind, transcript=transcript
            )
        except SwitchFailedError as e:
            log.info("goal %s blocked: %s", goal_id, e)
            return None

    async def compact(self, goal_id: str, ctx: Ctx) -> None:
        """docs/reference/loopd.md#s3-14: ``compaction.started``, pending switches first, the host's
        compaction, ``compaction.completed``."""
        started = await self.service.execute(c.StartCompaction(goal_id=goal_id), ctx)
        if not started:
            return
        ctx = ctx.caused_by(started[-1].event_id)
        error = None
        try:
            await self.goals.compact(goal_id, ctx)
        except (GoalLostError, UnfencedWriteError):
            raise  # not the host's failure: this engine may not write about the goal
        except Exception as e:  # the reference swallows compaction errors; keep what went wrong
            error = str(e) or type(e).__name__
        await self.service.execute(c.CompleteCompaction(goal_id=goal_id, error=error), ctx)

    async def account(self, goal_id: str, messages: list[TranscriptMessage], ctx: Ctx) -> None:
        """Usage of the completed assistant messages not yet counted (the turn starter's accounting)."""
        await self.turns.account(goal_id, messages, ctx)

    # -- shared mode: one member of a group (the balance pass's :class:`.ports.Holder`) --------------------

    def goal_ids(self) -> list[str]:
        """Every goal this engine has seen in the log."""
        return list(self.tracker.goals)

    async def load(self, goal_id: str) -> GoalState:
        """The goal folded from its stream."""
        return await self.service.load(goal_id)

    def pending(self, goal_id: str) -> bool:
        """Notices or awaits of the goal still to be handled (its holder keeps it until they are)."""
        return self.outbox.pending_for(goal_id) or self.awaits.pending_for(goal_id)

    async def adopt(self, goal_id: str, *, resend: bool = True) -> None:
        """Finish what the goal's previous holder may have left half done, as a restart would: an open switch,
        the goal's notices, fired awaits, the running turn's prompt (``resend``), the timers."""
        ctx = Ctx.new()
        try:
            await self.goals.recover(ctx, only=goal_id)
            await self._replay_notices(goal_id)
            await self.awaits.adopt(goal_id, ctx)
            state = await self.service.load(goal_id)
            if state.status == "active" and state.phase == "running":
                live = self.tracker.live(goal_id)
                live.watched_since = self.clock.now()
                if resend:
                    await self.turns.resend(goal_id, ctx)
                await self._idle_at_adoption(goal_id, state.worker_session_id)
                if live.candidate_at is not None and live.candidate_generation == state.run_generation:
                    # the candidate's timer went off while another member held the goal (or none did)
                    due = after(live.candidate_at, self.config.confirm_idle_ms)
                    self.tracker.schedule(goal_id, "confirm", max(due, self.clock.now()))
            elif state.status == "active" and state.phase == "waiting_retry" and state.retry_after:
                self.tracker.schedule(goal_id, "retry", state.retry_after)
        except GoalLostError as e:
            log.info("lost a goal while adopting it: %s", e)
        await self.catch_up()

    async def _idle_at_adoption(self, goal_id: str, worker: str | None) -> None:
        """An idle worker at adoption is the turn's first idle signal: the host's own idle event went by while
        no member held the goal (a new goal's first turn often ends before any member claimed it), and only the
        holder acts on a goal's events, so waiting for the next one would wait for the maintenance pass."""
        if worker is not None and await self.host.session_status(worker) == "idle":
            await self.on_idle(goal_id)
            await self.catch_up(react=False)  # the candidate it may have staged sets the goal's timer

    async def _replay_notices(self, goal_id: str) -> None:
        """Record the notices the goal's events call for that nobody recorded yet (recording is idempotent)."""
        try:
            events = [e async for e in self.store.read_stream(goal_stream(goal_id)) if e.type in NOTICE_TYPES]
        except StreamNotFoundError:
            return
        for env in events:
            await self.notice(env)

    # -- timers --------------------------------------------------------------------------------------

    async def run_due(self) -> int:
        """Run every timer due now, then maintenance if its time has come; returns how many ran."""
        now = self.clock.now()
        ran = 0
        for goal_id, kind in self.tracker.pop_due(now):
            if not self.owns(goal_id):
                continue  # its holder runs it; an adopter sets the goal's timers again (adopt)
            try:
                await self.guard(goal_id)
                ran += 1
                if kind == "confirm":
                    await self.idle.confirm_timer(goal_id)
                elif kind == "retry":
                    await self._retry_timer(goal_id)
            except GoalLostError as e:
                log.info("%s", e)
            await self.catch_up()
        if self.next_maintenance is not None and now >= self.next_maintenance:
            await self.guard(None)
            await self.maintenance.run()
            self.next_maintenance = after(now, self.config.maintenance_ms)
            ran += 1
            await self.catch_up()
        return ran

    def next_wakeup(self) -> datetime | None:
        """When :meth:`run_due` next has something to do."""
        due = self.tracker.next_due()
        if self.next_maintenance is None:
            return due
        return min(due, self.next_maintenance) if due is not None else self.next_maintenance

    async def _retry_timer(self, goal_id: str) -> None:
        state = await self.service.load(goal_id)
        if (
            not (state.exists and state.status == "active" and state.phase == "waiting_retry")
            or state.interactive
        ):
            return
        if state.retry_after is not None and self.clock.now() < state.retry_after:
            # an older failure's timer (e.g. replayed at start-up): wait for the current deadline
            self.tracker.schedule(goal_id, "retry", state.retry_after)
            return
        await self.continue_goal(goal_id, Ctx.new())
