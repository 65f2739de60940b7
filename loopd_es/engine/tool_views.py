"""A goal as the reference's tools show it: camelCase fields, its ``config``, ``runtime`` and identity records.

``get_goal`` (docs/reference/loopd.md#s3-16), ``inspect_background_goal`` (#s3-22, the tool the owner notices
point to), a ``list_background_goals`` row and a ``loopd_list_models`` assigned goal (#s3-21) each read a folded
:class:`~loopd_es.domain.state.GoalState`; this module names its fields the way the reference's state does
(``runCount``, ``modelSwitch.pending.requestedAt``, ``lastProviderLimit.retryAt`` ...). Absent values are left out,
as JSON leaves out the reference's ``undefined``. Fields of loopd-es's own (``activeRunID``, ``runDeadline`` ...)
are added only under names the reference does not use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from ..clock import stamped_builtins

if TYPE_CHECKING:
    from ..domain.state import GoalState

QUOTA_OF_GOAL: Final = (
    "Remaining provider quota unknown; local quota errors are observations, not balance data. "
    "See loopd_list_models."
)
QUOTA_OF_ROW: Final = (
    "Remaining provider quota unknown; connected/enabled is not balance data. See loopd_list_models."
)


def camel_key(key: str) -> str:
    """``snake_case`` as the reference spells it: ``run_count`` → ``runCount``, ``provider_id`` → ``providerID``."""
    head, *rest = key.split("_")
    return head + "".join("ID" if part == "id" else part[:1].upper() + part[1:] for part in rest)


def reference_json(value: Any) -> Any:
    """``value`` (a Struct, or builtins) as JSON builtins with camelCase keys and no ``None`` values."""
    return _camel(stamped_builtins(value))


def reference_dict(value: Any) -> dict[str, Any]:
    """:func:`reference_json` of a Struct or mapping, typed as the object it is."""
    out = reference_json(value)
    assert isinstance(out, dict)
    return out


def _camel(value: Any) -> Any:
    if isinstance(value, dict):
        return {camel_key(k): _camel(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_camel(v) for v in value]
    return value


def _present(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


def _record(**parts: Any) -> dict[str, Any] | None:
    """A switch record (``{pending?, last?, lastFailure?}``), or ``None`` when it has no part."""
    found = {k: reference_json(v) for k, v in parts.items() if v is not None}
    return found or None


def identity_fields(g: GoalState) -> dict[str, Any]:
    """The goal's switch and fallback records: ``modelSwitch``, ``agentSwitch``, ``pendingIdentity``,
    ``modelFallback``, ``lastProviderLimit`` (each left out when the goal has none)."""
    return _present(
        {
            "modelSwitch": _record(
                pending=g.model_pending, last=g.model_last, lastFailure=g.model_last_failure
            ),
            "agentSwitch": _record(
                pending=g.agent_pending, last=g.agent_last, lastFailure=g.agent_last_failure
            ),
            "pendingIdentity": reference_json(g.pending_identity) if g.pending_identity else None,
            "modelFallback": reference_json(g.model_fallback) if g.model_fallback else None,
            "lastProviderLimit": reference_json(g.last_provider_limit) if g.last_provider_limit else None,
        }
    )


def _attempt(attempt: Any) -> dict[str, Any]:
    out = reference_dict(attempt)
    out["id"] = out.pop("attemptID", None)  # the reference's VerificationAttempt names its id ``id``
    return out


def runtime_view(
    g: GoalState, *, recent_attempts: int | None = None, details_max: int | None = None
) -> dict[str, Any]:
    """The goal's runtime as the reference's ``runtime`` object (#s1-3), with loopd-es's run markers beside it."""
    attempts = list(g.verification_attempts)
    recent = attempts if recent_attempts is None else attempts[-recent_attempts:]
    details = g.last_rejection_details
    return reference_dict(
        {
            "phase": g.phase,
            "runCount": g.run_count,
            "budgetTurnCount": g.budget_turn_count,
            "runGeneration": g.run_generation,
            "evaluatorRejectionCount": g.evaluator_rejection_count,
            "freeRetryPending": g.free_retry_pending,
            "lastRejectionDetails": details[:details_max] if details and details_max else details,
            "consecutiveFailures": g.consecutive_failures,
            "noProgressCount": g.no_progress_count,
            "lastError": g.last_error,
            "lastProgressAt": g.last_progress.at if g.last_progress else None,
            "lastRunAt": g.last_run_at,
            "lastCompactAt": g.last_compact_at,
            "activePromptMessageID": g.active_prompt_message_id,
            "idleCandidateGeneration": g.idle_candidate_generation,
            "idleConfirmFailedGeneration": g.confirm_failed_generation,
            "workerAbortedAt": g.worker_aborted_at,
            "retryAfter": g.retry_after,
            "forceFinishRequested": g.force_finish_requested,
            "turnStartedAt": g.turn_started_at,
            "leaseExpiresAt": g.run_deadline,
            "lastWorkerStatus": g.last_worker_status,
            "scheduleRunCount": g.schedule_run_count,
            "nextRunAt": g.next_run_at,
            "lastScheduleAt": g.last_schedule_at,
            "activeRunID": g.active_run_id,
        }
    ) | _present(
        {
            "lastVerificationAttempt": _attempt(attempts[-1]) if attempts else None,
            "recentVerificationAttempts": [_attempt(a) for a in recent] if recent else None,
        }
    )


def _config(g: GoalState, *, full: bool) -> dict[str, Any]:
    cfg = g.config
    fields: dict[str, Any] = {
        "maxTurns": cfg.max_turns,
        "maxFailures": cfg.max_failures,
        "timeoutMs": cfg.timeout_ms,
        "progressFile": cfg.progress_file,
        "checks": list(cfg.checks) or None,
        "checkCwd": cfg.check_cwd,
        "workspaceWrite": cfg.workspace_write,
        "agent": cfg.agent,
        "model": cfg.model,
        "fallbackModels": list(cfg.fallback_models),
        "schedule": cfg.schedule,
    }
    if full:  # get_goal's config (formatGoalStructured)
        fields |= {
            "promptFile": cfg.prompt_file,
            "includeFiles": list(cfg.include_files) or None,
            "maxNoProgress": cfg.max_no_progress,
            "compactEvery": cfg.compact_every,
            "maxEvaluatorRejections": cfg.max_evaluator_rejections,
        }
    else:  # inspect_background_goal's
        fields |= {"parentAgent": g.parent_agent, "parentModel": g.parent_model}
    return reference_dict(fields)


def _usage(g: GoalState) -> dict[str, Any]:
    return reference_dict(
        {
            "lastProgress": g.last_progress,
            "completionEvidence": g.completion_evidence,
            "blocker": g.blocker,
            "tokensUsed": g.tokens_used,
            "tokenBudget": g.config.token_budget,
            "costUsed": g.cost_used,
            "costBudget": g.config.cost_budget,
            "timeUsedSeconds": g.time_used_seconds,
        }
    )


def _who(g: GoalState) -> dict[str, Any]:
    """The keys every full view of a goal starts with, in the reference's order."""
    return {
        "id": g.goal_id,
        "name": g.name,
        "objective": g.objective,
        "status": g.status,
        "ownerSessionID": g.owner_session_id,
        "workerSessionID": g.worker_session_id,
    }


def goal_structured(g: GoalState) -> dict[str, Any]:
    """``get_goal``'s answer: the goal, its config, progress, blocker, usage and runtime (#s3-16)."""
    head = _present(_who(g) | {"config": _config(g, full=True)})
    return head | _usage(g) | {"runtime": runtime_view(g)}


def inspect_view(
    g: GoalState, live: dict[str, Any], progress_history: list[dict[str, Any]]
) -> dict[str, Any]:
    """``inspect_background_goal``'s answer: everything of the goal, and ``live`` (what the worker is doing)."""
    head = _present(
        _who(g)
        | {
            "workerTopology": g.topology,
            "nativeParentID": g.native_parent_id,
            "interactive": g.interactive or None,
            "config": _config(g, full=False),
            "lastProgress": reference_json(g.last_progress) if g.last_progress else None,
        }
    )
    inbox = [reference_json({"from": i.sender, "text": i.text, "at": i.at}) for i in g.inbox[-3:]]
    return (
        head
        | identity_fields(g)
        | {"quotaLimitation": QUOTA_OF_GOAL}
        | {k: v for k, v in _usage(g).items() if k != "lastProgress"}
        | {"progressHistory": progress_history, "pendingInbox": inbox, "live": live}
        | {"runtime": runtime_view(g, recent_attempts=2, details_max=800)}
    )


def list_row(g: GoalState) -> dict[str, Any]:
    """One goal of ``list_background_goals`` (seeds of 1.9.1 and 1.12.2): contract, turns, progress, blocker,
    identity and quota limitation."""
    progress, blocker = g.last_progress, g.blocker
    return (
        reference_dict(
            {
                "id": g.goal_id,
                "name": g.name,
                "status": g.status,
                "phase": g.phase,
                "turn": g.run_count,
                "budgetTurnCount": g.budget_turn_count,
                "maxTurns": g.config.max_turns,
                "agent": g.config.agent,
                "model": g.config.model,
            }
        )
        | identity_fields(g)
        | _present(
            {
                "fallbackModels": list(g.config.fallback_models),
                "quotaLimitation": QUOTA_OF_ROW,
                "lastProgress": progress.summary[:120] if progress else None,
                "lastProgressAt": reference_dict({"at": progress.at}).get("at") if progress else None,
                "blocker": blocker.reason[:120] if blocker else None,
                "evaluatorRejectionCount": g.evaluator_rejection_count,
                "retryAfter": reference_dict({"at": g.retry_after}).get("at"),
                "nextRunAt": reference_dict({"at": g.next_run_at}).get("at"),
                "scheduleRunCount": g.schedule_run_count,
                "consecutiveFailures": g.consecutive_failures,
                "noProgressCount": g.no_progress_count,
                "workerSessionID": g.worker_session_id,
            }
        )
    )


def assigned_goal(g: GoalState) -> dict[str, Any]:
    """One of the caller's goals in ``loopd_list_models``' ``assignedGoals`` (#s3-21)."""
    return _present(
        {
            "id": g.goal_id,
            "model": g.config.model,
            "agent": g.config.agent,
            "workerSessionID": g.worker_session_id,
            "fallbackModels": list(g.config.fallback_models),
        }
    ) | identity_fields(g)
