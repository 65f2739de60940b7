"""Compare a folded goal with its loopd snapshot: the fields an import promises to reproduce.

The import folds what it built and reports any promised field that still differs (a warning, never an
error: the ledger may hold history that contradicts the snapshot); the tests hold it to zero differences.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..clock import parse_or_none, stamp
from ..domain.evolve import evolve, initial
from .source import RefRuntime

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ..domain.state import GoalState
    from .builder import Emitted
    from .source import RefGoal


def expected(snap: RefGoal, rt: RefRuntime | None) -> dict[str, Any]:
    """The snapshot's values of every folded field the import promises to reproduce."""
    rt = rt or RefRuntime(goal_id=snap.id)
    blocker = snap.blocker
    ms, ags, fb = snap.model_switch, snap.agent_switch, snap.model_fallback
    result: dict[str, Any] = {
        "status": snap.status,
        "name": snap.name,
        "objective": snap.objective,
        "owner_session_id": snap.owner_session_id,
        "worker_session_id": snap.worker_session_id,
        "topology": snap.worker_topology,
        "model": snap.config.model,
        "agent": snap.config.agent,
        "interactive": bool(snap.interactive),
        "tokens_used": snap.tokens_used,
        "cost_used": round(snap.cost_used or 0.0, 9),
        "time_used_seconds": round(snap.time_used_seconds, 6),
        "run_count": rt.run_count,
        "budget_turn_count": rt.budget_turn_count,
        "consecutive_failures": rt.consecutive_failures,
        "evaluator_rejection_count": rt.evaluator_rejection_count or 0,
        "no_progress_count": rt.no_progress_count,
        "free_retry_pending": bool(rt.free_retry_pending),
        "schedule_run_count": rt.schedule_run_count or 0,
        "next_run_at": parse_or_none(rt.next_run_at),
        "last_progress": (
            snap.last_progress.summary,
            snap.last_progress.next,
            parse_or_none(snap.last_progress.at),
        )
        if snap.last_progress
        else None,
        "created_at": parse_or_none(snap.created_at),
        "last_parent_notified": (parse_or_none(rt.last_parent_notified_at), rt.last_parent_notified_for),
        "last_compact_at": parse_or_none(rt.last_compact_at),
        "last_schedule_at": parse_or_none(rt.last_schedule_at),
        "active_tool_call_ids": tuple(rt.active_tool_call_ids),
        "pending_model": ms.pending.model if ms and ms.pending else None,
        "pending_agent": ags.pending.agent if ags and ags.pending else None,
        "pending_identity": (snap.pending_identity.model, snap.pending_identity.agent)
        if snap.pending_identity
        else None,
        "provider_limit": snap.last_provider_limit.kind if snap.last_provider_limit else None,
        "fallback": (fb.status, tuple(fb.attempted)) if fb and fb.status != "disabled" else None,
    }
    if snap.status == "blocked":
        result["blocker"] = (
            (blocker.reason, blocker.needed, blocker.kind, parse_or_none(blocker.at))
            if blocker
            else ("", "", None, None)
        )
    if snap.status == "complete" and snap.completion_evidence:
        ev = snap.completion_evidence
        result["evidence"] = (ev.summary, ev.evidence, parse_or_none(ev.at))
    if snap.status == "active":
        result["phase"] = rt.phase
        if rt.phase == "running":
            result["active_run_id"] = rt.active_run_id
            result["run_generation"] = rt.run_generation
    return result


def folded(s: GoalState, keys: Iterable[str]) -> dict[str, Any]:
    """The same fields read from a folded :class:`GoalState`."""
    mp, fb = s.model_pending, s.model_fallback
    values: dict[str, Any] = {
        "status": s.status,
        "name": s.name,
        "objective": s.objective,
        "owner_session_id": s.owner_session_id,
        "worker_session_id": s.worker_session_id,
        "topology": s.topology,
        "model": s.config.model,
        "agent": s.config.agent,
        "interactive": s.interactive,
        "tokens_used": s.tokens_used,
        "cost_used": round(s.cost_used, 9),
        "time_used_seconds": round(s.time_used_seconds, 6),
        "run_count": s.run_count,
        "budget_turn_count": s.budget_turn_count,
        "consecutive_failures": s.consecutive_failures,
        "evaluator_rejection_count": s.evaluator_rejection_count,
        "no_progress_count": s.no_progress_count,
        "free_retry_pending": s.free_retry_pending,
        "schedule_run_count": s.schedule_run_count,
        "next_run_at": s.next_run_at,
        "last_progress": (s.last_progress.summary, s.last_progress.next, s.last_progress.at)
        if s.last_progress
        else None,
        "created_at": s.created_at,
        "last_parent_notified": (s.last_parent_notified_at, s.last_parent_notified_for),
        "last_compact_at": s.last_compact_at,
        "last_schedule_at": s.last_schedule_at,
        "active_tool_call_ids": s.active_tool_call_ids,
        "pending_model": mp.model if mp else None,
        "pending_agent": s.agent_pending.agent if s.agent_pending else None,
        "pending_identity": (s.pending_identity.model, s.pending_identity.agent)
        if s.pending_identity
        else None,
        "provider_limit": s.last_provider_limit.kind if s.last_provider_limit else None,
        "fallback": (fb.status, fb.attempted) if fb else None,
        "blocker": (s.blocker.reason, s.blocker.needed, s.blocker.kind, s.blocker.at) if s.blocker else None,
        "evidence": (s.completion_evidence.summary, s.completion_evidence.evidence, s.completion_evidence.at)
        if s.completion_evidence
        else None,
        "phase": s.phase,
        "active_run_id": s.active_run_id,
        "run_generation": s.run_generation,
    }
    return {k: values[k] for k in keys}


def differences(snap: RefGoal, rt: RefRuntime | None, items: Iterable[Emitted]) -> list[str]:
    """``field: folded X, state.json Y`` for every promised field the imported events do not reproduce."""
    state = initial(snap.id)
    for item in items:
        state = evolve(state, item.payload)
    want = expected(snap, rt)
    have = folded(state, want)
    return [
        f"{k}: folded {_shown(have[k])!r}, state.json {_shown(want[k])!r}" for k in want if have[k] != want[k]
    ]


def _shown(value: Any) -> Any:
    """``value`` with its times as text, for a readable difference."""
    if isinstance(value, datetime):
        return stamp(value)
    if isinstance(value, tuple):
        return tuple(_shown(v) for v in value)
    return value
