"""How :func:`~loopd_es.domain.evolve.evolve` folds the worker's identity: switches requested, deferred,
applied, failed and rolled back, provider limits and model fallbacks. Registered when
:mod:`~loopd_es.domain.evolve` is imported."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from msgspec.structs import replace

from ..events import identity as i
from .evolve_base import _HANDLERS, _Handler, _Memo, _on, _Refused
from .state import (
    ModelFallback,
    PendingAgent,
    PendingIdentity,
    PendingModel,
    ProviderLimit,
    SwitchFailure,
    SwitchInFlight,
    SwitchRecord,
)

if TYPE_CHECKING:
    from .state import GoalDraft


@_on(i.IdentitySwitchRequested)
def _switch_requested(d: GoalDraft, e: i.IdentitySwitchRequested, m: _Memo) -> None:
    d.switch_in_flight = SwitchInFlight(
        switch_id=e.switch_id,
        model=e.model,
        agent=e.agent,
        resume=e.resume,
        reason=e.reason,
        pending=e.pending,
    )


@_on(i.IdentitySwitchDeferred)
def _switch_deferred(d: GoalDraft, e: i.IdentitySwitchDeferred, m: _Memo) -> None:
    # deferred while another switch is in flight: newer than it, so that switch's outcome must not clear it
    after = d.switch_in_flight.switch_id if d.switch_in_flight is not None else None
    if e.model is not None and e.agent is not None:
        d.pending_identity = PendingIdentity(model=e.model, agent=e.agent, after_switch=after)
        d.model_pending = None
        d.agent_pending = None
    elif e.model is not None:
        d.model_pending = PendingModel(model=e.model, requested_at=e.at, reason=e.reason, after_switch=after)
    elif e.agent is not None:
        d.agent_pending = PendingAgent(agent=e.agent, requested_at=e.at, after_switch=after)
    else:
        raise _Refused(e.event_type, "neither model nor agent")


@_on(i.IdentitySwitchUnsupported)
def _switch_unsupported(d: GoalDraft, e: i.IdentitySwitchUnsupported, m: _Memo) -> None:
    if d.switch_in_flight is not None and d.switch_in_flight.switch_id == e.switch_id:
        d.switch_in_flight = None


@_on(i.IdentitySwitchApplied)
def _switch_applied(d: GoalDraft, e: i.IdentitySwitchApplied, m: _Memo) -> None:
    d.switch_in_flight = None
    switch_id = e.switch_id
    if e.to_model is not None:
        d.config = replace(d.config, model=e.to_model)
        d.model_last = SwitchRecord(
            to=e.to_model, at=e.at, outcome=e.outcome, from_=e.from_model, reason=e.reason
        )
        if d.model_pending is not None and d.model_pending.after_switch != switch_id:
            d.model_pending = None
        d.model_last_failure = None
    if e.to_agent is not None:
        d.config = replace(d.config, agent=e.to_agent)
        d.agent_last = SwitchRecord(to=e.to_agent, at=e.at, outcome=e.outcome, from_=e.from_agent)
        if d.agent_pending is not None and d.agent_pending.after_switch != switch_id:
            d.agent_pending = None
        d.agent_last_failure = None
    if (
        e.target == "identity"
        and d.pending_identity is not None
        and d.pending_identity.after_switch != switch_id
    ):
        d.pending_identity = None


@_on(i.IdentitySwitchFailed)
def _switch_failed(d: GoalDraft, e: i.IdentitySwitchFailed, m: _Memo) -> None:
    failure = SwitchFailure(at=e.at, reason=e.reason)
    d.switch_in_flight = None
    if e.target == "model":
        d.model_last_failure = failure
        if e.pending:
            d.model_pending = None
    elif e.target == "agent":
        d.agent_last_failure = failure
        if e.pending:
            d.agent_pending = None
    elif e.pending:
        d.pending_identity = None


@_on(i.IdentitySwitchRolledBack)
def _rolled_back(d: GoalDraft, e: i.IdentitySwitchRolledBack, m: _Memo) -> None:
    """Nothing to fold: the rollback restored what the failed switch had left as it was."""


@_on(i.IdentityRollbackFailed)
def _rollback_failed(d: GoalDraft, e: i.IdentityRollbackFailed, m: _Memo) -> None:
    """Nothing to fold: recorded for the owner and the sagas, not for the goal's state."""


@_on(i.ProviderLimitObserved)
def _provider_limit(d: GoalDraft, e: i.ProviderLimitObserved, m: _Memo) -> None:
    d.last_provider_limit = ProviderLimit.of(e)
    if e.marks_blocker and d.blocker is not None:
        d.blocker = replace(d.blocker, kind="provider-limit")
    current = d.retry_after
    if d.phase == "waiting_retry" and e.retry_at is not None and current is not None and e.retry_at > current:
        d.retry_after = e.retry_at


@_on(i.FallbackPrepared)
def _fallback_prepared(d: GoalDraft, e: i.FallbackPrepared, m: _Memo) -> None:
    d.model_fallback = ModelFallback(attempted=e.attempted, status="prepared")
    if not (e.reused and d.model_pending is not None):
        d.model_pending = PendingModel(model=e.model, requested_at=e.at, reason="quota", limit=e.limit)


def _fallback_status(status: Any) -> _Handler:
    def apply(d: GoalDraft, e: Any, m: _Memo) -> None:
        d.model_fallback = ModelFallback(attempted=e.attempted, status=status)

    return apply


_HANDLERS[i.FallbackExhausted] = _fallback_status("exhausted")
_HANDLERS[i.FallbackUnsupported] = _fallback_status("unsupported")
_HANDLERS[i.FallbackUnavailable] = _fallback_status("unavailable")
