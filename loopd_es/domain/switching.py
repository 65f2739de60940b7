"""The decision halves of identity switching (docs/reference/loopd.md#s3-10) and provider-error observation
(docs/reference/loopd.md#s3-11).

The host-calling halves are sagas: they read ``identity.switch_requested``, call the host, and come back
with :class:`~loopd_es.domain.goal_commands.RecordSwitchOutcome`, which is decided here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from ..clock import whole_ms
from ..events import goal as g
from ..events import identity as i
from ..events import run as r
from ..events.base import Event
from . import goal_commands as c
from .provider_limit import classify
from .rules import (
    NOT_OWNED,
    BadArgument,
    RuleError,
    assert_writer_slot,
    invalid_model,
    is_model_ref,
    run_in_time,
    stale_run,
    unusable_model,
)
from .state import GoalState

if TYPE_CHECKING:
    from ..events.identity import ProviderLimitFacts

_Decider = Callable[[Any, GoalState, c.Facts], list[Event]]
DECIDERS: Final[dict[type, _Decider]] = {}

_PENDING_BLOCKERS: Final = {
    "identity": (
        "Pending identity switch was not accepted.",
        "Inspect the existing session, switch identity explicitly, then retry when safe.",
    ),
    "model": (
        "Pending model switch was not accepted.",
        "Discover available models, switch the same goal explicitly, then retry when safe.",
    ),
    "agent": (
        "Pending agent switch was not accepted.",
        "Discover agents, switch the same goal explicitly, then retry when safe.",
    ),
}


def _on(cls: type) -> Callable[[_Decider], _Decider]:
    def register(fn: _Decider) -> _Decider:
        DECIDERS[cls] = fn
        return fn

    return register


@_on(c.SwitchIdentity)
def _switch(cmd: c.SwitchIdentity, state: GoalState, facts: c.Facts) -> list[Event]:
    if cmd.model is None and cmd.agent is None:
        raise BadArgument("At least one of model or agent is required.")
    model, agent = cmd.model, cmd.agent
    if state.pending_identity is not None:
        model = model if model is not None else state.pending_identity.model
        agent = agent if agent is not None else state.pending_identity.agent
    if not state.exists or not cmd.caller or cmd.caller != state.owner_session_id:
        raise RuleError(NOT_OWNED, "not_found")
    if state.status == "complete":
        raise RuleError("Cannot switch a completed goal.")
    if cmd.resume:
        if agent is None:
            if not (
                state.status == "blocked"
                and state.blocker is not None
                and state.blocker.kind == "provider-limit"
            ):
                raise RuleError("resume is only valid for a provider-limit-blocked goal.")
        elif state.status != "blocked":
            raise RuleError("resume is only valid for a blocked goal.")
        assert_writer_slot(state, facts, cmd.caller)
    if model is not None:
        _validate_model(model, facts)
    if agent is not None:
        agent = _validate_agent(agent, facts)
    unsupported = (model is not None and not _can_switch_model(facts)) or (
        agent is not None and not _can_switch_agent(facts)
    )
    if unsupported or state.worker_session_id is None:
        return [
            i.IdentitySwitchUnsupported(
                goal_id=state.goal_id, switch_id=cmd.switch_id, model=model, agent=agent
            )
        ]
    now = whole_ms(facts.now)
    busy = state.switch_in_flight is not None or (state.phase == "running" and run_in_time(state, facts.now))
    if facts.worker_status != "idle" or busy:
        return [
            i.IdentitySwitchDeferred(
                goal_id=state.goal_id,
                switch_id=cmd.switch_id,
                model=model,
                agent=agent,
                at=now,
                worker_status=facts.worker_status,
            )
        ]
    return [
        i.IdentitySwitchRequested(
            goal_id=state.goal_id,
            switch_id=cmd.switch_id,
            model=model,
            agent=agent,
            resume=cmd.resume,
            requested_by=cmd.caller,
            at=now,
            worker_status=facts.worker_status,
        )
    ]


def _validate_model(model: str, facts: c.Facts) -> None:
    if not model.strip():
        raise BadArgument("Model is required: providerID/modelID.")
    if not is_model_ref(model):
        raise BadArgument(invalid_model(model))
    catalog = facts.model_catalog
    if catalog is not None and _can_switch_model(facts) and not catalog.usable(model):
        raise BadArgument(unusable_model(model))


def _validate_agent(agent: str, facts: c.Facts) -> str:
    name = agent.strip()
    if not name:
        raise BadArgument("Agent name is required.")
    catalog = facts.agent_catalog
    if catalog is not None and catalog.capability == "supported" and name not in catalog.agents:
        raise BadArgument("Agent is unavailable. Discover agents with loopd_list_models first.")
    return name


def _can_switch_model(facts: c.Facts) -> bool:
    cat = facts.model_catalog
    return (
        cat is not None
        and cat.capability == "supported"
        and cat.switching != "unsupported"
        and facts.can_switch_model
    )


def _can_switch_agent(facts: c.Facts) -> bool:
    cat = facts.agent_catalog
    return (
        cat is not None
        and cat.capability == "supported"
        and cat.switching != "unsupported"
        and facts.can_switch_agent
    )


@_on(c.ApplyPendingSwitch)
def _apply_pending(cmd: c.ApplyPendingSwitch, state: GoalState, facts: c.Facts) -> list[Event]:
    """The next pending switch becomes a request, or fails (and blocks) when the catalog no longer allows it."""
    if state.status != "active" or not state.exists or state.switch_in_flight is not None:
        return []
    if facts.worker_status != "idle":
        return []
    model: str | None
    agent: str | None
    if state.pending_identity is not None:
        target, model, agent, reason = (
            "identity",
            state.pending_identity.model,
            state.pending_identity.agent,
            "owner",
        )
    elif state.model_pending is not None:
        target, model, agent, reason = "model", state.model_pending.model, None, state.model_pending.reason
    elif state.agent_pending is not None:
        target, model, agent, reason = "agent", None, state.agent_pending.agent, "owner"
    else:
        return []
    try:
        if model is not None:
            _validate_model(model, facts)
            if not _can_switch_model(facts):
                raise RuleError("unsupported")
        if agent is not None:
            _validate_agent(agent, facts)
            if not _can_switch_agent(facts):
                raise RuleError("unsupported")
    except RuleError:
        return _failed(state, facts, cmd.switch_id, target, "catalog", "catalog-unavailable", pending=True)
    return [
        i.IdentitySwitchRequested(
            goal_id=state.goal_id,
            switch_id=cmd.switch_id,
            model=model,
            agent=agent,
            reason=reason,  # type: ignore[arg-type]
            pending=True,
            requested_by="pending",
            at=whole_ms(facts.now),
            worker_status=facts.worker_status,
        )
    ]


def _target(model: str | None, agent: str | None) -> i.SwitchTarget:
    if model is not None and agent is not None:
        return "identity"
    return "model" if model is not None else "agent"


def _failed(
    state: GoalState, facts: c.Facts, switch_id: str, target: Any, stage: Any, reason: Any, *, pending: bool
) -> list[Event]:
    now = whole_ms(facts.now)
    events: list[Event] = [
        i.IdentitySwitchFailed(
            goal_id=state.goal_id,
            switch_id=switch_id,
            target=target,
            stage=stage,
            reason=reason,
            pending=pending,
            at=now,
        )
    ]
    if pending and state.status == "active":
        why, needed = _PENDING_BLOCKERS[target]
        if reason == "interrupted":  # the reference's words are for a refusal; no host refused this one
            why = why.replace("was not accepted", "was interrupted (the process applying it stopped)")
        events.append(g.GoalBlocked(goal_id=state.goal_id, reason=why, needed=needed, at=now))
    return events


@_on(c.RecordSwitchOutcome)
def _outcome(cmd: c.RecordSwitchOutcome, state: GoalState, facts: c.Facts) -> list[Event]:
    flight = state.switch_in_flight
    if flight is None or flight.switch_id != cmd.switch_id:
        return []
    target = _target(flight.model, flight.agent)
    results = [x for x in (cmd.model_result, cmd.agent_result) if x is not None]
    # a goal completed while the host was switching keeps its identity: the saga must switch the host back
    refused = cmd.persist_failed or state.status == "complete"
    ok = not refused and bool(results) and all(x in ("applied", "next-prompt") for x in results)
    if not ok:
        if any(x == "unsupported" for x in results) and not refused and not flight.pending:
            return [
                i.IdentitySwitchUnsupported(
                    goal_id=state.goal_id, switch_id=flight.switch_id, model=flight.model, agent=flight.agent
                )
            ]
        stage = "persist" if refused else "host"
        reason = "interrupted" if cmd.interrupted else "host-rejected"
        events: list[Event] = _failed(
            state, facts, flight.switch_id, target, stage, reason, pending=flight.pending
        )
        if cmd.rolled_back is True:
            events.insert(
                1,
                i.IdentitySwitchRolledBack(
                    goal_id=state.goal_id,
                    switch_id=flight.switch_id,
                    model=state.config.model,
                    agent=state.config.agent,
                ),
            )
        elif cmd.rolled_back is False:
            events.insert(
                1,
                i.IdentityRollbackFailed(
                    goal_id=state.goal_id,
                    switch_id=flight.switch_id,
                    model=state.config.model,
                    agent=state.config.agent,
                ),
            )
        return events
    outcome: i.SwitchOutcome = "next-prompt" if "next-prompt" in results else "applied"
    applied: list[Event] = [
        i.IdentitySwitchApplied(
            goal_id=state.goal_id,
            switch_id=flight.switch_id,
            target=target,
            to_model=flight.model,
            to_agent=flight.agent,
            from_model=state.config.model,
            from_agent=state.config.agent,
            outcome=outcome,
            reason=flight.reason,
            at=whole_ms(facts.now),
        )
    ]
    if flight.resume and _still_resumable(state, target):
        assert_writer_slot(state, facts, state.owner_session_id)
        applied.append(g.GoalResumed(goal_id=state.goal_id, from_status=state.status, by="switch"))
    return applied


def _still_resumable(state: GoalState, target: str) -> bool:
    if state.status != "blocked":
        return False
    return target != "model" or (state.blocker is not None and state.blocker.kind == "provider-limit")


# -- provider errors ----------------------------------------------------------------------------------


@_on(c.ObserveProviderError)
def _observe(cmd: c.ObserveProviderError, state: GoalState, facts: c.Facts) -> list[Event]:
    if not state.exists:
        return []
    model_seen = cmd.expected_model or state.config.model
    observation = classify(cmd.error, cmd.source, facts.now, model_seen, retrying=cmd.via == "retry-status")
    if observation is None:
        return []
    return observe_limit(cmd, state, facts, observation)


def observe_limit(
    cmd: c.ObserveProviderError, state: GoalState, facts: c.Facts, observation: ProviderLimitFacts
) -> list[Event]:
    """:func:`decide` for a provider error already classified (a replay has the observation, not the error)."""
    if not state.exists:
        return []
    if cmd.fallback_turn:
        return _fallback_turn(cmd, state, facts, _observed(cmd, state, facts, observation))
    return _observed(cmd, state, facts, observation)


def _fallback_turn(
    cmd: c.ObserveProviderError, state: GoalState, facts: c.Facts, observed: list[Event]
) -> list[Event]:
    """The observation plus the end of the running turn when a fallback is ready for the next; else nothing."""
    prepared = next((e for e in observed if isinstance(e, i.FallbackPrepared)), None)
    run_id = state.active_run_id
    if prepared is None or state.status != "active" or state.phase != "running" or run_id is None:
        return []
    if stale_run(cmd.run_id, cmd.generation, state):
        return []
    limit = observed[0]
    assert isinstance(limit, i.ProviderLimitObserved)
    return [
        *observed,
        r.RunFellBack(
            goal_id=state.goal_id,
            run_id=run_id,
            kind=limit.kind,
            to_model=prepared.model,
            from_model=state.config.model,
            generation=state.run_generation,
            at=whole_ms(facts.now),
        ),
    ]


def _observed(
    cmd: c.ObserveProviderError, state: GoalState, facts: c.Facts, observation: ProviderLimitFacts
) -> list[Event]:
    model = state.config.model
    previous = state.model_fallback.attempted if state.model_fallback else ()
    attempted = tuple(dict.fromkeys((*previous, *([model] if model else []))))
    quota_blocked = state.status == "blocked" and state.last_error == cmd.error_text
    same_model = cmd.expected_model is None or cmd.expected_model == model
    pending = state.model_pending
    eligible = (
        same_model
        and state.pending_identity is None
        and (state.status == "active" or quota_blocked)
        and (pending is None or pending.reason == "quota")
    )
    events: list[Event] = [
        i.ProviderLimitObserved(
            goal_id=state.goal_id,
            kind=observation.kind,
            source=observation.source,
            observed_at=observation.observed_at,
            model=observation.model,
            status_code=observation.status_code,
            retry_at=observation.retry_at,
            marks_blocker=same_model and quota_blocked,
            via=cmd.via,
        )
    ]
    if not eligible:
        return events
    if pending is not None:
        events.append(
            i.FallbackPrepared(
                goal_id=state.goal_id,
                model=pending.model,
                attempted=attempted,
                at=whole_ms(facts.now),
                reused=True,
                limit=observation.kind,
            )
        )
        return events
    if not state.config.fallback_models:
        return events
    catalog = facts.model_catalog
    if (
        catalog is None
        or catalog.capability == "unsupported"
        or catalog.switching == "unsupported"
        or (not facts.can_switch_model)
    ):
        events.append(i.FallbackUnsupported(goal_id=state.goal_id, attempted=attempted))
        return events
    if catalog.capability != "supported":
        events.append(i.FallbackUnavailable(goal_id=state.goal_id, attempted=attempted))
        return events
    tried = list(attempted)
    for candidate in state.config.fallback_models:
        if candidate in tried:
            continue
        tried.append(candidate)
        if catalog.usable(candidate):
            events.append(
                i.FallbackPrepared(
                    goal_id=state.goal_id,
                    model=candidate,
                    attempted=tuple(tried),
                    at=whole_ms(facts.now),
                    limit=observation.kind,
                )
            )
            return events
    events.append(i.FallbackExhausted(goal_id=state.goal_id, attempted=tuple(tried)))
    return events
