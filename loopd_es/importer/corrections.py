"""Step 3 of a goal import: synthesise, from the snapshot, what the ledger-built fold still lacks.

Each step compares the folded state with ``state.json`` and emits only when they differ, in an order
chosen so that no step undoes an earlier one: status and blocker first (they release the lease), then
usage, last progress, rejections, the failure count and phase, manual mode, and identity last (pending
switches and the fallback outlive every status change).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from ..clock import parse_or_none
from ..events import goal as g
from ..events import identity as i
from ..events import run as r
from .builder import start_run

if TYPE_CHECKING:
    from .builder import GoalBuilder, When
    from .source import RefGoal, RefRuntime, RefSwitch


def correct(b: GoalBuilder, snap: RefGoal, rt: RefRuntime) -> None:
    """Run every correction in order (a field with no time of its own is dated ``updatedAt``)."""
    _status(b, snap, rt)
    _usage(b, snap, rt)
    _progress(b, snap)
    _rejections(b, snap, rt)
    _phase(b, snap, rt)
    if bool(snap.interactive) != b.state.interactive:
        b.emit(
            g.GoalInteractiveChanged(goal_id=b.goal_id, interactive=bool(snap.interactive)),
            "state:interactive",
            **_updated(snap),
        )
    _identity(b, snap)


def _status(b: GoalBuilder, snap: RefGoal, rt: RefRuntime) -> None:
    s, gid, want = b.state, b.goal_id, snap.status
    if want == "blocked":
        blk = snap.blocker
        reason, needed, kind, at = (blk.reason, blk.needed, blk.kind, blk.at) if blk else ("", "", None, "")
        have = s.blocker
        if (
            s.status != "blocked"
            or have is None
            or (have.reason, have.needed, have.kind) != (reason, needed, kind)
        ):
            b.emit(
                g.GoalBlocked(
                    goal_id=gid,
                    reason=reason,
                    needed=needed,
                    kind=kind,
                    at=parse_or_none(at),
                    last_error=rt.last_error,
                ),
                "state:goal.blocker",
                **_when(at, "state:goal.blocker.at", snap),
                cause=b.last_failure if rt.consecutive_failures else None,
            )
    elif want == "complete":
        ev = snap.completion_evidence
        summary, evidence, at = (ev.summary, ev.evidence, ev.at) if ev else ("", "", "")
        have_ev = s.completion_evidence
        if (
            s.status != "complete"
            or have_ev is None
            or (have_ev.summary, have_ev.evidence) != (summary, evidence)
        ):
            attempt = rt.last_verification_attempt
            forced = attempt is None or attempt.status != "passed"
            b.emit(
                g.GoalCompleted(
                    goal_id=gid,
                    summary=summary,
                    evidence=evidence,
                    forced=forced,
                    next_run_at=parse_or_none(rt.next_run_at),
                    at=parse_or_none(at),
                ),
                "state:goal.completionEvidence",
                **_when(at, "state:goal.completionEvidence.at", snap),
                cause=b.current_run(),
            )
    elif s.status == want:
        return
    elif want == "paused":
        b.emit(g.GoalPaused(goal_id=gid), "state:goal.status", **_updated(snap))
    elif want == "budget_limited":
        b.emit(budget_event(b, snap), "state:goal.status", **_updated(snap))
    elif want == "active" and s.status == "blocked":
        b.emit(g.GoalRetried(goal_id=gid), "state:goal.status", **_updated(snap))
    elif want == "active":
        b.emit(g.GoalResumed(goal_id=gid, from_status=s.status), "state:goal.status", **_updated(snap))
    else:
        b.emit(
            g.GoalStatusChanged(goal_id=gid, from_status=s.status, to_status=want),
            "state:goal.status",
            **_updated(snap),
        )


def budget_event(b: GoalBuilder, snap: RefGoal | None) -> g.GoalBudgetExhausted:
    """The budget stop with its reason: which budget, how much was used and its limit
    (docs/reference/loopd.md#s3-13)."""
    s = b.state
    tokens = snap.tokens_used if snap is not None else s.tokens_used
    cost = (snap.cost_used or 0.0) if snap is not None else s.cost_used
    token_budget = snap.token_budget if snap is not None else s.config.token_budget
    cost_budget = snap.cost_budget if snap is not None else s.config.cost_budget
    budget: Literal["tokens", "cost"] | None = None
    limit: float | None = None
    # the reference prefers the cost reason (docs/reference/loopd.md#s3-13)
    if cost_budget is not None and cost >= cost_budget:
        budget, limit = "cost", float(cost_budget)
        reason = f"Cost budget exhausted (${cost:.4f}/${cost_budget})"
    elif token_budget and tokens >= token_budget:
        budget, limit = "tokens", float(token_budget)
        reason = f"Token budget exhausted ({tokens}/{token_budget})"
    else:
        reason = "Budget exhausted (state.json does not say which)"
    return g.GoalBudgetExhausted(
        goal_id=b.goal_id, reason=reason, tokens_used=tokens, cost_used=cost, budget=budget, limit=limit
    )


def _updated(snap: RefGoal) -> When:
    """The time of a correction whose field has no time of its own: the goal record's ``updatedAt``."""
    return {"at": snap.updated_at, "at_from": "state:goal.updatedAt"}


def _when(at: str | None, field: str, snap: RefGoal) -> When:
    """The field's own time when it has one, else the goal record's ``updatedAt``."""
    return {"at": at, "at_from": field} if at else _updated(snap)


def _usage(b: GoalBuilder, snap: RefGoal, rt: RefRuntime) -> None:
    s = b.state
    tokens = snap.tokens_used - s.tokens_used
    cost = (snap.cost_used or 0.0) - s.cost_used
    seconds = snap.time_used_seconds - s.time_used_seconds
    ids = tuple(m for m in dict.fromkeys(rt.accounted_message_ids) if m not in s.accounted_message_ids)
    if not (tokens or cost or seconds or ids):
        return
    # loopd keeps only the last 200 counted ids; totals before them still need an id to be idempotent
    # (a mirror corrects again as the totals grow: each later correction is named by its stream position)
    first = f"imported-usage-{b.goal_id}"
    ids = ids or ((first,) if first not in s.accounted_message_ids else (f"{first}@{len(b.items)}",))
    b.emit(
        g.GoalUsageAccounted(
            goal_id=b.goal_id,
            message_ids=ids,
            token_delta=tokens,
            cost_delta=cost,
            time_delta_seconds=seconds,
        ),
        "state:goal.usage",
        **_updated(snap),
    )


def _progress(b: GoalBuilder, snap: RefGoal) -> None:
    p, have = snap.last_progress, b.state.last_progress
    if p is None or (have is not None and (have.summary, have.next) == (p.summary, p.next)):
        return
    b.emit(
        g.GoalProgressReported(goal_id=b.goal_id, summary=p.summary, next=p.next, at=parse_or_none(p.at)),
        "state:goal.lastProgress",
        **_when(p.at, "state:goal.lastProgress.at", snap),
    )


def _rejections(b: GoalBuilder, snap: RefGoal, rt: RefRuntime) -> None:
    want = rt.evaluator_rejection_count or 0
    if want == b.state.evaluator_rejection_count or want == 0:
        return
    attempt = rt.last_verification_attempt
    failed = attempt is not None and attempt.status == "failed"
    details = rt.last_rejection_details or ""
    b.emit(
        g.GoalCompletionRejected(
            goal_id=b.goal_id,
            attempt_id=attempt.id if attempt and failed else f"imported-attempt-{want}",
            rejection_count=want,
            failed_check_count=len(attempt.checks) if attempt and failed else 0,
            failure_summary=details[:500],
            details=details,
            free_retry=bool(rt.free_retry_pending),
        ),
        "state:runtime.evaluatorRejectionCount",
        **_when(
            attempt.completed_at if attempt else None,
            "state:runtime.lastVerificationAttempt.completedAt",
            snap,
        ),
    )


def _phase(b: GoalBuilder, snap: RefGoal, rt: RefRuntime) -> None:
    s, gid = b.state, b.goal_id
    upd: When = {"at": rt.updated_at or snap.updated_at, "at_from": "state:runtime.updatedAt"}
    if snap.status == "active" and rt.phase == "waiting_retry":
        if (s.phase, s.retry_after, s.consecutive_failures) == (
            "waiting_retry",
            parse_or_none(rt.retry_after),
            rt.consecutive_failures,
        ):
            return  # the ledger's last failure already says so (its backoff is computed the same way)
        run_id = rt.active_run_id or s.active_run_id or "unknown"
        b.emit(
            r.RunFailed(
                goal_id=gid,
                run_id=run_id,
                error=rt.last_error or "",
                consecutive_failures=rt.consecutive_failures,
                retry_after=parse_or_none(rt.retry_after),
            ),
            "state:runtime.retryAfter",
            cause=b.run_starts.get(run_id),
            **upd,
        )
        return
    if snap.status == "active" and rt.phase == "running":
        active = rt.active_run_id
        if active is not None and s.phase == "running" and s.active_run_id == active:
            return  # the ledger's run.started of the active run: never started twice
        if active is None or active in b.run_starts:
            b.report.warn(
                f"goal {gid}: state.json has it running "
                + (f"run {active}, which the ledger shows ended" if active else "with no activeRunID")
                + "; imported as not running"
            )
        else:
            turn_at = rt.turn_started_at or rt.last_run_at
            start_run(
                b,
                rt,
                active,
                rt.run_count,
                charged=False,  # the snapshot's budgetTurnCount already counts it (goal.runtime_imported)
                source="state:runtime.activeRunID",
                at=turn_at or rt.updated_at or snap.updated_at,
                at_from="state:runtime.turnStartedAt" if turn_at else "state:runtime.updatedAt",
            )
            return
    if s.phase == "running" and s.active_run_id is not None:
        b.emit(
            r.RunCompleted(goal_id=gid, run_id=s.active_run_id, generation=s.run_generation),
            "state:runtime.phase",
            cause=b.run_starts.get(s.active_run_id),
            **upd,
        )
    if rt.consecutive_failures and rt.consecutive_failures != b.state.consecutive_failures:
        b.emit(
            r.RunFailed(
                goal_id=gid,
                run_id=rt.active_run_id or "unknown",
                error=rt.last_error or "",
                consecutive_failures=rt.consecutive_failures,
            ),
            "state:runtime.consecutiveFailures",
            **upd,
        )


def _identity(b: GoalBuilder, snap: RefGoal) -> None:
    gid, cfg = b.goal_id, snap.config
    ms, ags, fb = snap.model_switch, snap.agent_switch, snap.model_fallback
    attempted = tuple(fb.attempted) if fb else ()
    pending_model = ms.pending if ms and ms.pending and ms.pending.model else None
    fallback_pending = (
        fb is not None
        and fb.status == "prepared"
        and pending_model is not None
        and pending_model.reason == "quota"
    )
    last = ms.last if ms else None
    if last is not None and last.to == cfg.model:
        if fb is not None and fb.status == "prepared" and last.reason == "quota" and not fallback_pending:
            b.emit(
                i.FallbackPrepared(
                    goal_id=gid, model=last.to, attempted=attempted, at=parse_or_none(last.at)
                ),
                "state:goal.modelFallback",
                **_when(last.at, "state:goal.modelSwitch.last.at", snap),
            )
        b.emit(
            i.IdentitySwitchApplied(
                goal_id=gid,
                switch_id=_switch_id(gid, "model-last"),
                target="model",
                to_model=last.to,
                from_model=last.from_,
                outcome=last.outcome,
                reason=last.reason,
                at=parse_or_none(last.at),
            ),
            "state:goal.modelSwitch.last",
            **_when(last.at, "state:goal.modelSwitch.last.at", snap),
        )
    alast = ags.last if ags else None
    if alast is not None and alast.to == cfg.agent:
        b.emit(
            i.IdentitySwitchApplied(
                goal_id=gid,
                switch_id=_switch_id(gid, "agent-last"),
                target="agent",
                to_agent=alast.to,
                from_agent=alast.from_,
                outcome=alast.outcome,
                at=parse_or_none(alast.at),
            ),
            "state:goal.agentSwitch.last",
            **_when(alast.at, "state:goal.agentSwitch.last.at", snap),
        )
    switches: tuple[tuple[Literal["model", "agent"], RefSwitch | None], ...] = (("model", ms), ("agent", ags))
    for target, sw in switches:
        failure = sw.last_failure if sw else None
        if failure is not None:
            b.emit(
                i.IdentitySwitchFailed(
                    goal_id=gid,
                    switch_id=_switch_id(gid, f"{target}-failure"),
                    target=target,
                    stage="host" if failure.reason == "host-rejected" else "catalog",
                    reason=failure.reason,
                    at=parse_or_none(failure.at),
                ),
                f"state:goal.{target}Switch.lastFailure",
                **_when(failure.at, f"state:goal.{target}Switch.lastFailure.at", snap),
            )
    if snap.pending_identity is not None:
        pi = snap.pending_identity
        b.emit(
            i.IdentitySwitchDeferred(
                goal_id=gid, switch_id=_switch_id(gid, "identity-pending"), model=pi.model, agent=pi.agent
            ),
            "state:goal.pendingIdentity",
            **_updated(snap),
        )
    if pending_model is not None and pending_model.model:
        if fallback_pending:
            b.emit(
                i.FallbackPrepared(
                    goal_id=gid,
                    model=pending_model.model,
                    attempted=attempted,
                    at=parse_or_none(pending_model.requested_at),
                ),
                "state:goal.modelFallback",
                **_when(pending_model.requested_at, "state:goal.modelSwitch.pending.requestedAt", snap),
            )
        else:
            b.emit(
                i.IdentitySwitchDeferred(
                    goal_id=gid,
                    switch_id=_switch_id(gid, "model-pending"),
                    model=pending_model.model,
                    reason=pending_model.reason,
                    at=parse_or_none(pending_model.requested_at),
                ),
                "state:goal.modelSwitch.pending",
                **_when(pending_model.requested_at, "state:goal.modelSwitch.pending.requestedAt", snap),
            )
    pending_agent = ags.pending if ags and ags.pending and ags.pending.agent else None
    if pending_agent is not None and pending_agent.agent:
        b.emit(
            i.IdentitySwitchDeferred(
                goal_id=gid,
                switch_id=_switch_id(gid, "agent-pending"),
                agent=pending_agent.agent,
                at=parse_or_none(pending_agent.requested_at),
            ),
            "state:goal.agentSwitch.pending",
            **_when(pending_agent.requested_at, "state:goal.agentSwitch.pending.requestedAt", snap),
        )
    if fb is not None and fb.status in ("exhausted", "unsupported", "unavailable"):
        cls = {
            "exhausted": i.FallbackExhausted,
            "unsupported": i.FallbackUnsupported,
            "unavailable": i.FallbackUnavailable,
        }[fb.status]
        b.emit(cls(goal_id=gid, attempted=attempted), "state:goal.modelFallback", **_updated(snap))
    limit = snap.last_provider_limit
    if limit is not None:
        marks = (
            snap.status == "blocked" and snap.blocker is not None and snap.blocker.kind == "provider-limit"
        )
        b.emit(
            i.ProviderLimitObserved(
                goal_id=gid,
                kind=limit.kind,
                source=limit.source,
                observed_at=parse_or_none(limit.observed_at),
                model=limit.model,
                status_code=limit.status_code,
                retry_at=parse_or_none(limit.retry_at),
                marks_blocker=marks,
            ),
            "state:goal.lastProviderLimit",
            **_when(limit.observed_at, "state:goal.lastProviderLimit.observedAt", snap),
        )


def _switch_id(goal_id: str, what: str) -> str:
    return f"imported-{goal_id}-{what}"
