"""``evolve(state, event) -> state``: the pure, total fold of a goal stream.

Events are facts, so evolve applies them as recorded; the rules live in the deciders. The only events
evolve refuses are those that *cannot* apply: anything before ``goal.created`` or after ``goal.cleared``, a
second ``goal.created``, a run event of another generation (the stale-event fence of reference §2.3), an
event of another goal, or a payload that does not decode. Those are recorded as anomalies on the state and
folding goes on: evolve never raises.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

import msgspec
from msgspec.structs import replace

from ..errors import InvalidEventError
from ..events import goal as g
from ..events import identity as i
from ..events import run as r
from ..events.base import CATALOGUE, payload_decoder
from ..events.catalogue import decode_payload
from ..events.envelope import Envelope
from .state import (
    MAX_ACCOUNTED_IDS,
    MAX_ANOMALIES,
    Anomaly,
    Blocker,
    Evidence,
    GoalState,
    InboxItem,
    ModelFallback,
    PendingAgent,
    PendingIdentity,
    PendingModel,
    Progress,
    ProviderLimit,
    SwitchFailure,
    SwitchInFlight,
    SwitchRecord,
)

if TYPE_CHECKING:
    from ..events.base import Event


_Handler = Callable[[GoalState, Any], GoalState]
_HANDLERS: Final[dict[type[Event], _Handler]] = {}


def _on(cls: type[Event]) -> Callable[[_Handler], _Handler]:
    def register(fn: _Handler) -> _Handler:
        _HANDLERS[cls] = fn
        return fn

    return register


def initial(goal_id: str) -> GoalState:
    """The state of a goal stream before its first event."""
    return GoalState(goal_id=goal_id)


def evolve(state: GoalState, item: Event | Envelope) -> GoalState:
    """Fold one event (or a stored envelope) into ``state``; never raises."""
    event: Event
    if type(item) is Envelope:
        decoded = _decode(item)
        if isinstance(decoded, str):
            return _anomaly(replace(state, version=item.version, position=item.position), item.type, decoded)
        event = decoded
        state = replace(state, version=item.version, position=item.position)
    else:
        assert not isinstance(item, Envelope)
        event = item
    handler = _HANDLERS.get(type(event))
    if handler is None:
        return _anomaly(state, event.event_type, "not a goal event")
    goal_id = getattr(event, "goal_id", None)
    if goal_id != state.goal_id:
        return _anomaly(state, event.event_type, f"event of goal {goal_id!r} on the stream of {state.goal_id!r}")
    if not state.exists and not isinstance(event, g.GoalCreated):
        why = "goal was cleared" if state.cleared else "goal does not exist"
        return _anomaly(state, event.event_type, why)
    return handler(state, event)


def _decode(env: Envelope) -> Event | str:
    """The payload, or the reason it cannot be read; the current-version path skips the catalogue's checks."""
    cls = CATALOGUE.get(env.type)
    if cls is not None and env.schema_version == cls.schema_version:
        try:
            result: Event = payload_decoder(env.type).decode(env.data)
            return result
        except msgspec.ValidationError:
            pass
    try:
        return decode_payload(env)
    except InvalidEventError as e:
        return str(e)


def fold(events: Any, state: GoalState) -> GoalState:
    """Fold an iterable of events or envelopes, left to right."""
    for item in events:
        state = evolve(state, item)
    return state


def _anomaly(state: GoalState, type_: str, reason: str) -> GoalState:
    kept = (*state.anomalies, Anomaly(type=type_, reason=reason, version=state.version))[-MAX_ANOMALIES:]
    return replace(state, anomalies=kept, anomaly_count=state.anomaly_count + 1)


def _released(state: GoalState, **changes: Any) -> GoalState:
    """The reference's ``releaseLease`` plus clearing the run (every caller here clears ``activeRunID``)."""
    return replace(
        state,
        phase="idle",
        lease_expires_at=None,
        active_run_id=None,
        active_prompt_message_id=None,
        idle_candidate_generation=None,
        **changes,
    )


def _stale(state: GoalState, event: Any) -> bool:
    generation = getattr(event, "generation", None)
    if generation is not None and generation != state.run_generation:
        return True
    return state.active_run_id is not None and event.run_id != state.active_run_id


# -- goal lifecycle ---------------------------------------------------------------------------------


@_on(g.GoalCreated)
def _created(s: GoalState, e: g.GoalCreated) -> GoalState:
    if s.exists:
        return _anomaly(s, e.event_type, "goal already exists")
    return replace(
        s,
        exists=True,
        name=e.name,
        objective=e.objective,
        owner_session_id=e.owner_session_id,
        config=e.config,
        interactive=e.config.interactive,
        parent_model=e.parent_model,
        parent_agent=e.parent_agent,
        status="active",
        phase="queued",
        created_at=e.at,
    )


@_on(g.GoalWorkerAssigned)
def _worker(s: GoalState, e: g.GoalWorkerAssigned) -> GoalState:
    return replace(s, worker_session_id=e.worker_session_id, topology=e.topology)


@_on(g.GoalStatusChanged)
def _status(s: GoalState, e: g.GoalStatusChanged) -> GoalState:
    if e.to_status in ("budget_limited", "paused"):
        return _released(s, status=e.to_status)
    return replace(s, status=e.to_status)


@_on(g.GoalPaused)
def _paused(s: GoalState, e: g.GoalPaused) -> GoalState:
    return _released(s, status="paused")


@_on(g.GoalResumed)
def _resumed(s: GoalState, e: g.GoalResumed) -> GoalState:
    if e.by == "switch":
        return replace(s, status="active", blocker=None)
    return replace(s, status="active")


@_on(g.GoalRetried)
def _retried(s: GoalState, e: g.GoalRetried) -> GoalState:
    return _released(
        s,
        status="active",
        consecutive_failures=0,
        last_error=None,
        force_finish_requested=None,
        evaluator_rejection_count=0,
        last_rejection_details=None,
        free_retry_pending=False,
    )


@_on(g.GoalCleared)
def _cleared(s: GoalState, e: g.GoalCleared) -> GoalState:
    return _released(s, exists=False, cleared=True, inbox=())


@_on(g.GoalProgressReported)
def _progress(s: GoalState, e: g.GoalProgressReported) -> GoalState:
    return replace(
        s,
        progress_during_turn=True,
        no_progress_count=0,
        consecutive_failures=0,
        last_progress=Progress(summary=e.summary, next=e.next, at=e.at),
    )


@_on(g.GoalCompletionRejected)
def _rejected(s: GoalState, e: g.GoalCompletionRejected) -> GoalState:
    s = replace(s, evaluator_rejection_count=e.rejection_count, last_rejection_details=e.details or None)
    if e.free_retry:
        return replace(s, force_finish_requested=False, free_retry_pending=True)
    return _released(s, free_retry_pending=False, force_finish_requested=None)


@_on(g.GoalCompleted)
def _completed(s: GoalState, e: g.GoalCompleted) -> GoalState:
    s = _released(
        s, status="complete", completion_evidence=Evidence(summary=e.summary, evidence=e.evidence, at=e.at),
        last_error=None,
    )
    if s.config.schedule is not None and not e.forced:
        s = replace(s, schedule_run_count=s.schedule_run_count + 1, next_run_at=e.next_run_at)
    return s


@_on(g.GoalBlocked)
def _blocked(s: GoalState, e: g.GoalBlocked) -> GoalState:
    blocker = Blocker(reason=e.reason, needed=e.needed, kind=e.kind, at=e.at)
    s = _released(s, status="blocked", blocker=blocker, force_finish_requested=None, retry_after=None)
    return replace(s, last_error=e.last_error) if e.last_error is not None else s


@_on(g.GoalWorkerAborted)
def _aborted(s: GoalState, e: g.GoalWorkerAborted) -> GoalState:
    return _released(s, worker_aborted_at=e.at)


@_on(g.GoalInteractiveChanged)
def _interactive(s: GoalState, e: g.GoalInteractiveChanged) -> GoalState:
    return replace(s, interactive=e.interactive)


@_on(g.GoalUsageAccounted)
def _usage(s: GoalState, e: g.GoalUsageAccounted) -> GoalState:
    seen = s.accounted_message_ids
    fresh = tuple(m for m in dict.fromkeys(e.message_ids) if m not in seen)
    if not fresh:
        return _anomaly(s, e.event_type, "every message id was already accounted")
    if len(fresh) != len(e.message_ids):
        return _anomaly(s, e.event_type, "some message ids were already accounted; deltas not applied")
    return replace(
        s,
        tokens_used=s.tokens_used + e.token_delta,
        cost_used=s.cost_used + e.cost_delta,
        time_used_seconds=s.time_used_seconds + e.time_delta_seconds,
        turn_tokens_used=s.turn_tokens_used + e.token_delta,
        accounted_message_ids=(*s.accounted_message_ids, *fresh)[-MAX_ACCOUNTED_IDS:],
    )


@_on(g.GoalInputQueued)
def _queued(s: GoalState, e: g.GoalInputQueued) -> GoalState:
    if any(item.input_id == e.input_id for item in s.inbox):
        return _anomaly(s, e.event_type, f"input {e.input_id} is already queued")
    return replace(s, inbox=(*s.inbox, InboxItem(input_id=e.input_id, text=e.text, sender=e.sender, at=e.at)))


@_on(g.GoalInputDelivered)
def _delivered(s: GoalState, e: g.GoalInputDelivered) -> GoalState:
    ids = set(e.input_ids)
    return replace(s, inbox=tuple(item for item in s.inbox if item.input_id not in ids))


@_on(g.GoalNudged)
def _nudged(s: GoalState, e: g.GoalNudged) -> GoalState:
    return replace(s, phase="idle", active_run_id=None, idle_candidate_generation=None, active_prompt_message_id=None)


@_on(g.GoalForceFinishRequested)
def _force_finish(s: GoalState, e: g.GoalForceFinishRequested) -> GoalState:
    return replace(s, force_finish_requested=True)


@_on(g.GoalBudgetExhausted)
def _budget(s: GoalState, e: g.GoalBudgetExhausted) -> GoalState:
    return _released(s, status="budget_limited")


# -- runs ---------------------------------------------------------------------------------------------


@_on(r.RunStarted)
def _run_started(s: GoalState, e: r.RunStarted) -> GoalState:
    if e.generation <= s.run_generation:
        return _anomaly(s, e.event_type, f"generation {e.generation} is not after {s.run_generation}")
    return replace(
        s,
        phase="running",
        active_run_id=e.run_id,
        active_prompt_message_id=e.prompt_message_id,
        run_generation=e.generation,
        lease_expires_at=e.lease_expires_at,
        run_count=e.turn_count,
        budget_turn_count=s.budget_turn_count + (1 if e.charged else 0),
        free_retry_pending=False if not e.charged else s.free_retry_pending,
        progress_during_turn=False,
        turn_tokens_used=0,
        idle_candidate_generation=None,
        retry_after=None,
    )


@_on(r.RunIdleCandidate)
def _idle_candidate(s: GoalState, e: r.RunIdleCandidate) -> GoalState:
    if _stale(s, e):
        return _anomaly(s, e.event_type, "stale run")
    return replace(s, idle_candidate_generation=e.generation)


@_on(r.RunCompleted)
def _run_completed(s: GoalState, e: r.RunCompleted) -> GoalState:
    if s.active_run_id != e.run_id or _stale(s, e):
        return _anomaly(s, e.event_type, "stale run")
    return _released(s, confirm_failed_generation=None)


@_on(r.RunFailed)
def _run_failed(s: GoalState, e: r.RunFailed) -> GoalState:
    s = _released(s, consecutive_failures=e.consecutive_failures, last_error=e.error)
    if e.retry_after is not None:
        return replace(s, phase="waiting_retry", retry_after=e.retry_after)
    return s


@_on(r.RunRecovered)
def _run_recovered(s: GoalState, e: r.RunRecovered) -> GoalState:
    if _stale(s, e):
        return _anomaly(s, e.event_type, "stale run")
    return _released(s, confirm_failed_generation=None)


@_on(r.RunStuck)
def _run_stuck(s: GoalState, e: r.RunStuck) -> GoalState:
    return replace(s, stuck_notified_run_id=e.run_id)


@_on(r.RunConfirmFailed)
def _confirm_failed(s: GoalState, e: r.RunConfirmFailed) -> GoalState:
    if e.generation != s.run_generation:
        return _anomaly(s, e.event_type, "stale run")
    return replace(s, confirm_failed_generation=e.generation)


# -- identity -----------------------------------------------------------------------------------------


@_on(i.IdentitySwitchRequested)
def _switch_requested(s: GoalState, e: i.IdentitySwitchRequested) -> GoalState:
    flight = SwitchInFlight(
        switch_id=e.switch_id, model=e.model, agent=e.agent, resume=e.resume, reason=e.reason, pending=e.pending
    )
    return replace(s, switch_in_flight=flight)


@_on(i.IdentitySwitchDeferred)
def _switch_deferred(s: GoalState, e: i.IdentitySwitchDeferred) -> GoalState:
    if e.model is not None and e.agent is not None:
        pair = PendingIdentity(model=e.model, agent=e.agent)
        return replace(s, pending_identity=pair, model_pending=None, agent_pending=None)
    if e.model is not None:
        return replace(s, model_pending=PendingModel(model=e.model, requested_at=e.at, reason=e.reason))
    if e.agent is not None:
        return replace(s, agent_pending=PendingAgent(agent=e.agent, requested_at=e.at))
    return _anomaly(s, e.event_type, "neither model nor agent")


@_on(i.IdentitySwitchUnsupported)
def _switch_unsupported(s: GoalState, e: i.IdentitySwitchUnsupported) -> GoalState:
    if s.switch_in_flight is not None and s.switch_in_flight.switch_id == e.switch_id:
        return replace(s, switch_in_flight=None)
    return s


@_on(i.IdentitySwitchApplied)
def _switch_applied(s: GoalState, e: i.IdentitySwitchApplied) -> GoalState:
    config = s.config
    changes: dict[str, Any] = {"switch_in_flight": None}
    if e.to_model is not None:
        config = replace(config, model=e.to_model)
        changes["model_last"] = SwitchRecord(to=e.to_model, at=e.at, outcome=e.outcome, from_=e.from_model,
                                             reason=e.reason)
        changes["model_pending"] = None
        changes["model_last_failure"] = None
    if e.to_agent is not None:
        config = replace(config, agent=e.to_agent)
        changes["agent_last"] = SwitchRecord(to=e.to_agent, at=e.at, outcome=e.outcome, from_=e.from_agent)
        changes["agent_pending"] = None
        changes["agent_last_failure"] = None
    if e.target == "identity":
        changes["pending_identity"] = None
    return replace(s, config=config, **changes)


@_on(i.IdentitySwitchFailed)
def _switch_failed(s: GoalState, e: i.IdentitySwitchFailed) -> GoalState:
    failure = SwitchFailure(at=e.at, reason=e.reason)
    changes: dict[str, Any] = {"switch_in_flight": None}
    if e.target == "model":
        changes.update(model_last_failure=failure, model_pending=None if e.pending else s.model_pending)
    elif e.target == "agent":
        changes.update(agent_last_failure=failure, agent_pending=None if e.pending else s.agent_pending)
    elif e.pending:
        changes["pending_identity"] = None
    return replace(s, **changes)


@_on(i.IdentitySwitchRolledBack)
def _rolled_back(s: GoalState, e: i.IdentitySwitchRolledBack) -> GoalState:
    return s


@_on(i.IdentityRollbackFailed)
def _rollback_failed(s: GoalState, e: i.IdentityRollbackFailed) -> GoalState:
    return s


@_on(i.ProviderLimitObserved)
def _provider_limit(s: GoalState, e: i.ProviderLimitObserved) -> GoalState:
    limit = ProviderLimit(
        kind=e.kind, source=e.source, observed_at=e.observed_at, model=e.model, status_code=e.status_code,
        retry_at=e.retry_at,
    )
    changes: dict[str, Any] = {"last_provider_limit": limit}
    if e.marks_blocker and s.blocker is not None:
        changes["blocker"] = replace(s.blocker, kind="provider-limit")
    if s.phase == "waiting_retry" and e.retry_at and s.retry_after and e.retry_at > s.retry_after:
        changes["retry_after"] = e.retry_at
    return replace(s, **changes)


@_on(i.FallbackPrepared)
def _fallback_prepared(s: GoalState, e: i.FallbackPrepared) -> GoalState:
    fallback = ModelFallback(attempted=e.attempted, status="prepared")
    if e.reused and s.model_pending is not None:
        return replace(s, model_fallback=fallback)
    return replace(s, model_fallback=fallback,
                   model_pending=PendingModel(model=e.model, requested_at=e.at, reason="quota"))


def _fallback_status(status: Any) -> _Handler:
    def apply(s: GoalState, e: Any) -> GoalState:
        return replace(s, model_fallback=ModelFallback(attempted=e.attempted, status=status))

    return apply


_HANDLERS[i.FallbackExhausted] = _fallback_status("exhausted")
_HANDLERS[i.FallbackUnsupported] = _fallback_status("unsupported")
_HANDLERS[i.FallbackUnavailable] = _fallback_status("unavailable")
