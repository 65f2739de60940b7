"""Starting a turn (docs/reference/loopd.md#s3-2 ``continueTurn``) with the full steering prompt, the inbox
and its delivery.

``run.started`` is recorded *before* the prompt is sent, with the prompt's message id; the host delivers a
message id once. So a crash between the two is repaired by sending the same prompt id again
(:meth:`TurnStarter.resend`), which the host either delivers now or ignores: never twice, never lost. Inbox
messages leave the inbox (``goal.input_delivered``) only after the host accepted the prompt carrying them.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import TYPE_CHECKING, Literal, NamedTuple, Protocol

import msgspec

from ..clock import stamp
from ..domain import goal_commands as c
from ..domain.prompts import ProgressLine, Snippet, bare_prompt, continuation_prompt, first_prompt
from ..domain.rules import run_in_time
from ..host.errors import HostError, ProviderError
from ..host.events import EngineHost
from ..sagas.fallback import observe_provider_error
from ..sagas.identity_switch import SwitchReport

if TYPE_CHECKING:
    from datetime import datetime

    from ..domain.state import GoalState
    from ..events.base import Event
    from ..events.envelope import Envelope
    from ..host.base import WorkerHost
    from ..host.events import TranscriptMessage
    from .service import Ctx, GoalService

Kind = Literal["steer", "bare", "force_finish"]
Guard = Callable[[str | None], Awaitable[None]]
"""Called before a side effect about a goal (``None``: about no goal); raises when this process may no longer
act for it (its engine lease was taken, or in a shared group the goal's claim)."""


async def no_guard(goal_id: str | None = None) -> None:
    return None


USAGE_WINDOW = 50
RECENT_WINDOW = 5
"""The latest transcript messages a continuation prompt quotes."""


class Transcript(NamedTuple):
    """A worker's transcript as read a moment ago (the idle confirmation reads it), reused by the turn that
    follows instead of reading it again: the worker is idle, so its latest messages have not changed."""

    session_id: str
    messages: list[TranscriptMessage]


class TurnReport(msgspec.Struct, kw_only=True):
    """What an attempt to start a turn did: ``started`` (prompted), or why not."""

    goal_id: str
    result: Literal[
        "started",
        "not-active",
        "running",
        "no-worker",
        "busy",
        "waiting",
        "interactive",
        "prompt-failed",
        "switch-failed",
        "switching",
        "queued",
    ]
    switches: list[SwitchReport] = msgspec.field(default_factory=list)
    detail: str = ""


def assistant_messages(messages: list[TranscriptMessage]) -> tuple[c.AssistantMessage, ...]:
    """Transcript messages as the usage decider reads them (it counts completed assistant ones only)."""
    return tuple(
        c.AssistantMessage(
            message_id=m.message_id,
            role=m.role,
            completed=m.completed,
            input=m.input,
            output=m.output,
            reasoning=m.reasoning,
            cache_read=m.cache_read,
            cache_write=m.cache_write,
            cost=m.cost,
            duration_ms=m.duration_ms,
        )
        for m in messages
    )


def usage_of(goal_id: str, messages: list[TranscriptMessage]) -> list[c.GoalCommand]:
    """The usage command for the completed assistant messages of a transcript (none when there are none)."""
    if any(m.role == "assistant" and m.completed for m in messages):
        return [c.AccountUsage(goal_id=goal_id, messages=assistant_messages(messages))]
    return []


FollowUpStep = Literal["stop", "compact", "steer", "force_finish"]


def follow_up(state: GoalState, decided: Collection[str]) -> FollowUpStep:
    """What follows a confirmed run (docs/reference/loopd.md#s3-13), from the goal's state after it and the
    event types its confirmation decided: nothing (the goal is no longer active), compaction on its cadence, the
    force-finish turn, or the next steering turn."""
    if state.status != "active":
        return "stop"  # blocked (the owner is told from the log) or out of budget
    if "goal.force_finish_requested" in decided:
        return "force_finish"
    every = state.config.compact_every
    if every and state.run_count > 0 and state.run_count % every == 0:
        return "compact"
    return "steer"


def starts_plainly(state: GoalState, now: datetime) -> bool:
    """Whether an engine turn (not an owner's) on ``state`` goes straight to ``run.started`` once the worker is
    idle: what :meth:`TurnStarter.continue_turn` checks before the status, with no switch to apply or wait for.
    Anything else takes that method's way, which says why or acts first."""
    return (
        state.exists
        and state.status == "active"
        and not state.interactive
        and not (state.phase == "running" and run_in_time(state, now))
        and state.switch_in_flight is None
        and state.worker_session_id is not None
        and not (state.pending_identity or state.model_pending or state.agent_pending)
    )


class PendingSwitches(Protocol):
    """Who applies a goal's pending identity switches before its turn (:class:`~loopd_es.app.goals.Goals`)."""

    async def apply_pending(self, goal_id: str, ctx: Ctx) -> list[SwitchReport]:
        """Apply them in order; raises ``SwitchFailedError`` when one is refused (the goal is then blocked)."""
        ...


class TurnStarter:
    """Acquires turns and sends their prompts for one goal service and its host.

    With a host that reports transcripts (:class:`~loopd_es.host.events.EngineHost`) a continuation quotes the
    recent work and a restart can resend a prompt the host never got; with any other host it does without.
    """

    def __init__(self, service: GoalService, switches: PendingSwitches, guard: Guard | None = None) -> None:
        self.service = service
        self.host: WorkerHost = service.host
        self.switches = switches
        self.guard = guard or no_guard

    @functools.cached_property
    def transcripts(self) -> EngineHost | None:
        """The host when it reports transcripts, asked once (when first needed): a protocol ``isinstance``
        costs ~50 us, and a tool call builds a starter it rarely uses."""
        return self.host if isinstance(self.host, EngineHost) else None

    async def _messages(self, session_id: str, limit: int) -> list[TranscriptMessage]:
        if self.transcripts is None:
            return []
        try:
            return await self.transcripts.messages(session_id, limit=limit)
        except HostError:
            return []

    async def recent(self, session_id: str) -> list[TranscriptMessage]:
        """The worker's latest messages (as many as usage accounting reads); none when the host has no
        transcripts or cannot answer now."""
        return await self._messages(session_id, USAGE_WINDOW)

    async def account(self, goal_id: str, messages: list[TranscriptMessage], ctx: Ctx) -> None:
        """Usage of completed assistant messages not yet counted (idempotent by message id,
        docs/reference/loopd.md#s3-12)."""
        for usage in usage_of(goal_id, messages):
            await self.service.execute(usage, ctx)

    async def confirm_and_start(
        self, goal_id: str, confirm: Sequence[c.GoalCommand], ctx: Ctx, transcript: Transcript | None
    ) -> tuple[list[Envelope], TurnReport | None]:
        """Record a confirmed run (``confirm``: its usage, then the confirmation) and, when a plain next turn
        follows it (:func:`follow_up`, :func:`starts_plainly`), that turn's ``run.started`` in the same commit,
        then send its prompt.

        Returns the envelopes of the last command (the confirmation) and the turn's report: ``None`` when no
        turn was started here, so the caller goes its ordinary way after the confirmation (compaction,
        switches, a busy worker, ...).
        """
        service = self.service
        run_id, prompt_id = str(uuid.uuid4()), f"msg_{uuid.uuid4()}"
        kinds: list[Kind] = []

        async def then(after: GoalState, decided: Sequence[Event]) -> c.GoalCommand | None:
            step = follow_up(after, {e.event_type for e in decided})
            worker = after.worker_session_id
            if step not in ("steer", "force_finish") or not starts_plainly(after, service.clock.now()):
                return None  # decided before the status is asked, as continue_turn does
            if worker is None or await self.host.session_status(worker) != "idle":
                return None  # busy, or unknown (a host's answer when it cannot tell): the ordinary way asks again
            kinds[:] = ["force_finish" if step == "force_finish" else "steer"]
            return c.StartRun(goal_id=goal_id, run_id=run_id, prompt_message_id=prompt_id, kind=kinds[0])

        decided, started = await service.execute_chain(confirm, then, ctx)
        confirmed = decided[-1]
        if not started:
            return confirmed, None
        result = await self.send(
            goal_id, ctx.caused_by(started[-1].event_id), kind=kinds[0], transcript=transcript, fresh=True
        )
        return confirmed, TurnReport(goal_id=goal_id, result=result)

    async def continue_turn(
        self,
        goal_id: str,
        ctx: Ctx,
        *,
        explicit: bool,
        force: bool = False,
        kind: Kind = "steer",
        transcript: Transcript | None = None,
    ) -> TurnReport:
        """Start the goal's next turn if it may run (docs/reference/loopd.md#s3-2): pending switches first,
        then the prompt.

        ``explicit`` marks an owner action: without it an interactive goal is never prompted
        (docs/reference/loopd.md#s3-9).
        ``transcript``, the worker's transcript just read (by the idle confirmation), is quoted instead of
        reading it again.

        :raises SwitchFailedError: when a pending switch is refused; the goal is then blocked.
        """
        service = self.service
        state = await service.load(goal_id)
        if not state.exists or state.status != "active":
            return TurnReport(goal_id=goal_id, result="not-active")
        if state.interactive and not explicit:
            return TurnReport(goal_id=goal_id, result="interactive")
        if state.phase == "running" and run_in_time(state, service.clock.now()):
            return TurnReport(goal_id=goal_id, result="running")
        if state.switch_in_flight is not None:  # no turn with the identity being replaced
            queued = await self._wait_for_switch(state, ctx, explicit=explicit, force=force, kind=kind)
            if queued is not None:
                return queued
            return await self.continue_turn(  # the switch ended meanwhile: decide again on what it left
                goal_id, ctx, explicit=explicit, force=force, kind=kind, transcript=transcript
            )
        worker = state.worker_session_id
        if worker is None:
            return TurnReport(goal_id=goal_id, result="no-worker")
        status = await self.host.session_status(worker)
        has_pending = bool(state.pending_identity or state.model_pending or state.agent_pending)
        if status != "idle" and (not force or has_pending):
            return TurnReport(goal_id=goal_id, result="busy")
        switches = await self.switches.apply_pending(goal_id, ctx) if has_pending else []
        state = await service.load(goal_id)
        if kind == "bare" and not state.inbox:
            kind = "steer"
        run_id, prompt_id = str(uuid.uuid4()), f"msg_{uuid.uuid4()}"
        started = await service.execute(
            c.StartRun(goal_id=goal_id, run_id=run_id, prompt_message_id=prompt_id, kind=kind), ctx
        )
        if not started:  # decided on the goal's current version: another process may have moved it meanwhile
            now = await service.load(goal_id)
            if now.switch_in_flight is not None:
                queued = await self._wait_for_switch(now, ctx, explicit=explicit, force=force, kind=kind)
                if queued is None:
                    return await self.continue_turn(
                        goal_id, ctx, explicit=explicit, force=force, kind=kind, transcript=transcript
                    )
                queued.switches = switches
                return queued
            return TurnReport(goal_id=goal_id, result="not-active", switches=switches)
        ctx = ctx.caused_by(started[-1].event_id)
        result = await self.send(goal_id, ctx, kind=kind, transcript=transcript, fresh=True)
        return TurnReport(goal_id=goal_id, result=result, switches=switches)

    async def _wait_for_switch(
        self, state: GoalState, ctx: Ctx, *, explicit: bool, force: bool, kind: Kind
    ) -> TurnReport | None:
        """A turn asked for while a switch is in flight: the engine's own waits for its next chance; an owner's
        is recorded (``goal.turn_requested``) and runs once the switch has ended (:meth:`Goals.run_requested
        <loopd_es.app.goals.Goals.run_requested>`). ``None``: the switch ended before the request was recorded.
        """
        flight = state.switch_in_flight
        assert flight is not None
        if not explicit:
            return TurnReport(goal_id=state.goal_id, result="switching", detail=flight.switch_id)
        request = c.RequestTurn(
            goal_id=state.goal_id,
            switch_id=flight.switch_id,
            kind="bare" if kind == "bare" else "steer",
            force=force,
        )
        await self.service.execute(request, ctx)
        now = await self.service.load(state.goal_id)
        if now.switch_in_flight is None or now.switch_in_flight.switch_id != flight.switch_id:
            return None  # the switch ended first: the request was not recorded (or a new switch began)
        return TurnReport(goal_id=state.goal_id, result="queued", detail=flight.switch_id)

    async def send(
        self,
        goal_id: str,
        ctx: Ctx,
        *,
        kind: Kind,
        transcript: Transcript | None = None,
        fresh: bool = False,
    ) -> Literal["started", "prompt-failed"]:
        """Build the running turn's prompt and send it under its prompt id; record delivery or failure.

        ``fresh``: the prompt id was made up for this turn a moment ago (not a resend after a restart).
        """
        state = await self.service.load(goal_id)
        worker, prompt_id = state.worker_session_id, state.active_prompt_message_id
        if worker is None or prompt_id is None:
            return "prompt-failed"
        items = state.inbox
        if kind == "bare":
            text = bare_prompt(items)
        elif state.run_count <= 1:
            text = first_prompt(state)
        else:
            text = await self._continuation(
                state,
                ctx,
                force_finish=kind == "force_finish" or bool(state.force_finish_requested),
                transcript=transcript,
            )
        await self.guard(goal_id)  # fenced: a process that lost the engine lease (or the goal) sends nothing
        # Only a restarted engine resends a prompt id (resend, after reading run.started), and only once it
        # holds the lease: with the lease just checked, a fresh id cannot be on the host yet, so the host's
        # transcript look-up (a round trip) is skipped. Unfenced callers (the CLI, the tool API) keep it.
        fenced = fresh and self.guard is not no_guard
        try:
            await self.host.prompt(
                worker,
                text,
                model=state.config.model,
                agent=state.config.agent,
                prompt_id=prompt_id,
                fresh=fenced,
            )
        except ProviderError as e:
            await observe_provider_error(
                self.service,
                goal_id,
                e.info.as_reported(),
                ctx,
                source="prompt-delivery",
                run_id=state.active_run_id,
                generation=state.run_generation,
            )
            return "prompt-failed"
        except HostError as e:
            await self.service.execute(
                c.RecordRunFailure(
                    goal_id=goal_id,
                    error_text=str(e),
                    source="prompt-delivery",
                    run_id=state.active_run_id,
                    generation=state.run_generation,
                ),
                ctx,
            )
            return "prompt-failed"
        if items:
            run_id = (await self.service.load(goal_id)).active_run_id
            delivered = c.RecordInputDelivered(
                goal_id=goal_id, input_ids=tuple(i.input_id for i in items), run_id=run_id
            )
            await self.service.execute(delivered, ctx)
        return "started"

    async def resend(self, goal_id: str, ctx: Ctx) -> bool:
        """After a restart: send the running turn's prompt again unless the host's transcript already has it."""
        state = await self.service.load(goal_id)
        worker, prompt_id = state.worker_session_id, state.active_prompt_message_id
        if state.status != "active" or state.phase != "running" or worker is None or prompt_id is None:
            return False
        if not isinstance(self.host, EngineHost):
            return False
        try:
            transcript = await self.host.messages(worker, limit=200)
        except HostError:
            return False
        sent = next((m for m in transcript if m.message_id == prompt_id), None)
        if sent is not None:  # delivered before the crash: only its inbox delivery may be missing
            carried = tuple(i.input_id for i in state.inbox if f"[{i.sender}] {i.text}" in sent.text)
            if carried:
                delivered = c.RecordInputDelivered(
                    goal_id=goal_id, input_ids=carried, run_id=state.active_run_id
                )
                await self.service.execute(delivered, ctx)
            return False
        kind: Kind = "force_finish" if state.force_finish_requested else "steer"
        return await self.send(goal_id, ctx, kind=kind) == "started"

    async def _continuation(
        self, state: GoalState, ctx: Ctx, *, force_finish: bool, transcript: Transcript | None
    ) -> str:
        worker = state.worker_session_id
        if transcript is not None and transcript.session_id == worker:
            recent = transcript.messages[-RECENT_WINDOW:]
        else:
            recent = await self._messages(worker, RECENT_WINDOW) if worker is not None else []
        await self.account(state.goal_id, recent, ctx)
        progress = (
            [
                ProgressLine(
                    summary=state.last_progress.summary,
                    next=state.last_progress.next,
                    at=stamp(state.last_progress.at),
                )
            ]
            if state.last_progress is not None
            else []
        )
        snippets = [Snippet(role=m.role, text=m.text) for m in recent if m.text]
        return continuation_prompt(state, progress=progress, recent=snippets, force_finish=force_finish)
