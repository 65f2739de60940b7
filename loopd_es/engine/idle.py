"""The two-stage idle (docs/reference/loopd.md#s2-3), with a fast path: a turn whose end the transcript proves
is confirmed
at its first idle signal.

The reference waits a fixed quiet period after the first idle because idles repeat, can come before an error
and can come before trailing parts. The engine fences each turn by its own prompt id, so when the transcript
at an idle (the host's stream mirror of it when the host has one, else a read) shows the answer to that id
completed, stopped for a reason other than a tool call, without an
error, with no tool running and nothing after it (:func:`.idle_rules.turn_proven`), the turn is over and the
next one goes out at once. Everything else - no answer for the prompt yet, a tool still running, an error or a
trailing part that may still come - keeps the quiet period: a candidate (``run.idle_candidate``, fenced by the
run's generation), confirmed by a second idle at least ``confirm_idle_ms`` later against the transcript.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..app.service import Ctx
from ..app.turns import USAGE_WINDOW, Transcript, usage_of
from ..clock import ms_between, whole_ms
from ..domain import goal_commands as c
from ..host.errors import HostError
from .idle_rules import confirm_failure, turn_proven

if TYPE_CHECKING:
    from ..clock import Clock
    from ..domain.state import GoalState
    from ..host.events import EngineHost, TranscriptMessage
    from .live import Live, Tracker
    from .ports import GoalLog, TurnDriver

TRANSCRIPT_WINDOW = 200


class IdleGate:
    """One engine's idle signals: prove, stage, confirm, continue."""

    def __init__(
        self,
        goals: GoalLog,
        turns: TurnDriver,
        host: EngineHost,
        tracker: Tracker,
        clock: Clock,
        *,
        confirm_idle_ms: int,
    ) -> None:
        self.goals = goals
        self.turns = turns
        self.host = host
        self.tracker = tracker
        self.clock = clock
        self.confirm_idle_ms = confirm_idle_ms

    async def on_idle(self, goal_id: str) -> bool:
        """An idle signal for the goal's worker (an event or a status poll): prove or stage, confirm, continue."""
        state = await self.goals.load(goal_id)
        if not state.exists or state.status != "active" or state.interactive:
            return False
        if state.phase != "running" or state.active_run_id is None:
            return False
        live = self.tracker.live(goal_id)
        if live.tools:
            live.candidate_at, live.candidate_generation = None, None
            return True
        ctx = Ctx.new()
        read = await self._proven(state) if live.assistant_completed_at is not None else None
        live.proven = read is not None
        if read is None:
            confirmed, read = await self._quiet(state, live, ctx)
            if not confirmed:
                return True
        confirm = c.ConfirmIdle(goal_id=goal_id, run_id=state.active_run_id, generation=state.run_generation)
        usage = [] if read is None else usage_of(goal_id, read.messages[-USAGE_WINDOW:])
        # the usage, the confirmation and a plain next turn's start are one commit; the next turn quotes the
        # transcript just read (or mirrored from the host's stream): at most one read per turn
        await self.turns.confirm_turn(goal_id, [*usage, confirm], ctx, read)
        return True

    async def _proven(self, state: GoalState) -> Transcript | None:
        """The worker's transcript when it proves the running turn over (the fast path), else ``None``.

        Only read once the stream has told of a completed answer to the prompt: an idle before that (a late
        one from the previous turn, or one right after the prompt) cannot be proven and costs no round trip.
        """
        worker, prompt = state.worker_session_id, state.active_prompt_message_id
        if worker is None or prompt is None:
            return None
        try:
            transcript = await self.transcript(worker)
        except HostError:
            return None
        return Transcript(worker, transcript) if turn_proven(transcript, prompt) else None

    async def _quiet(self, state: GoalState, live: Live, ctx: Ctx) -> tuple[bool, Transcript | None]:
        """The quiet-period path: whether the turn is confirmed (not while staged, waiting, or refused by the
        transcript), and the transcript read to confirm it (``None`` when there is none to read)."""
        now = self.clock.now()
        gen = state.run_generation
        if live.candidate_generation != gen or live.candidate_at is None:
            await self._stage(state, ctx)
            return False, None
        if ms_between(now, live.candidate_at) < self.confirm_idle_ms:
            return False, None
        quiet_since = live.assistant_completed_at or live.candidate_at
        if (
            live.last_activity is not None
            and whole_ms(live.last_activity) > live.candidate_at
            and live.last_activity > quiet_since
        ):
            await self._stage(state, ctx)  # activity since the candidate: start the quiet period again
            return False, None
        worker, prompt = state.worker_session_id, state.active_prompt_message_id
        if prompt is None or worker is None:
            return True, None
        try:
            transcript = await self.transcript(worker)
        except HostError:
            return False, None
        reason = confirm_failure(transcript, prompt, anchored=live.assistant_completed_at is not None)
        if reason is None:
            return True, Transcript(worker, transcript)
        assert state.active_run_id is not None
        failed = c.RecordConfirmFailure(
            goal_id=state.goal_id, run_id=state.active_run_id, generation=gen, reason=reason
        )
        await self.goals.execute(failed, ctx)
        return False, None

    async def transcript(self, worker: str) -> list[TranscriptMessage]:
        """The worker's latest messages for a confirmation: the usage window, or the whole confirmation window
        when the usage window holds no user message (a turn of many tool calls).

        The verdict depends only on the latest user message and what follows it, so a window that holds a
        user message (or the whole transcript) gives the same verdict as a longer one, at a fraction of the
        bytes: OpenCode returns every message with all its parts, ~5 KB for a steering prompt. The messages
        come from the host's stream mirror when it has one (:meth:`EngineHost.streamed_messages`).
        """
        recent = await self._messages(worker, USAGE_WINDOW)
        if len(recent) < USAGE_WINDOW or any(m.role == "user" for m in recent):
            return recent
        return await self._messages(worker, TRANSCRIPT_WINDOW)

    async def _messages(self, worker: str, limit: int) -> list[TranscriptMessage]:
        """The messages as the host's event stream told them when it can vouch for them (no round trip on the
        path from the idle to the next prompt), else read."""
        streamed = self.host.streamed_messages(worker, limit=limit)
        return streamed if streamed is not None else await self.host.messages(worker, limit=limit)

    async def _stage(self, state: GoalState, ctx: Ctx) -> None:
        assert state.active_run_id is not None
        stage = c.StageIdleCandidate(
            goal_id=state.goal_id, run_id=state.active_run_id, generation=state.run_generation
        )
        await self.goals.execute(stage, ctx)

    async def confirm_timer(self, goal_id: str) -> None:
        """The candidate's quiet period ended: poll the worker; still idle means the second signal."""
        state = await self.goals.load(goal_id)
        if state.worker_session_id is None or state.phase != "running":
            return
        live = self.tracker.live(goal_id)
        if live.candidate_at is None or live.candidate_generation != state.run_generation:
            return  # confirmed by an idle event meanwhile, and the next run started: nothing to poll for
        if await self.host.session_status(state.worker_session_id) == "idle":
            await self.on_idle(goal_id)
