"""Map one loopd goal (its ledger lines and its state snapshot) to the events of its ``goal-<id>`` stream.

The ledger has the history but is lossy (reference §4.1: appended after the state write, many mutations
emit nothing); ``state.json`` is authoritative but has no history. So the stream is built in three steps,
folding through :func:`loopd_es.domain.evolve.evolve` as it goes:

1. ``goal.created`` (from its ledger line when there is one, with the configuration from the snapshot)
   and the worker assignment;
2. every ledger line, in file order, with turns the ledger lost filled in as synthetic runs (the
   ``turnCount`` gaps); a line that would not apply (a stale run, say) is left out and reported;
3. corrections synthesised from the snapshot wherever the fold still differs from it
   (:mod:`.corrections`).

The whole stream is built twice: the first pass counts runs, the second shifts run generations and
un-charges surplus synthetic turns so the counters end where the snapshot has them. Whatever still
differs afterwards (fields no event can set) is reported by :func:`.check.differences`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Final

import msgspec

from ..events import goal as g
from ..events import run as r
from ..events.envelope import parse_rfc3339
from .builder import Emitted, GoalBuilder, fill_turns, start_run
from .corrections import correct
from .source import (
    LBlocked,
    LCompleted,
    LConfirmFailed,
    LGoalCreated,
    LInteractive,
    LProgress,
    LRejected,
    LRun,
    LStatusChanged,
    typed,
)

if TYPE_CHECKING:
    from pathlib import Path

    from ..events.base import Event
    from .source import LedgerLine, RefGoal, RefRuntime

DEFAULT_MAX_FAILURES: Final = 5
DEFAULT_MAX_REJECTIONS: Final = 3
NOT_MODELLED: Final = frozenset({"compaction.started", "compaction.completed", "runtime.phase_changed"})
"""Ledger types with no loopd-es event: compaction is not modelled, the phase change is never emitted."""


class GoalInput(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the import knows about one goal; ``goal`` is None when loopd no longer has it."""

    goal_id: str
    goal: RefGoal | None
    runtime: RefRuntime | None
    lines: tuple[LedgerLine, ...]
    ledger_path: Path


def build_goal(data: GoalInput, warnings: list[str]) -> list[Emitted]:
    """The events of one goal's stream; built twice so generations and free turns end where the snapshot says.

    The first pass counts runs; the second shifts generations so the last run has the snapshot's
    ``runGeneration`` and leaves the excess synthetic runs uncharged so ``budgetTurnCount`` matches.
    """
    first = _build(data, [], 0, None)
    rt = data.runtime
    if rt is None or data.goal is None:
        warnings.extend(first.warnings)
        return first.items
    offset = max(0, rt.run_generation - first.runs)
    excess = max(0, min(first.state.budget_turn_count - rt.budget_turn_count, len(first.synth_runs)))
    final = _build(data, warnings, offset, len(first.synth_runs) - excess)
    return final.items


def _build(data: GoalInput, warnings: list[str], gen_offset: int, charged_synth: int | None) -> GoalBuilder:
    b = GoalBuilder(data.goal_id, warnings, gen_offset, charged_synth)
    snap, rt = data.goal, data.runtime
    created_line = next((ln for ln in data.lines if ln.type == "goal.created"), None)
    if not _create(b, data, created_line):
        return b
    free_next = False
    for line in data.lines:
        if line is created_line:
            continue
        free_next = _ledger(b, data, line, free_next)
    if snap is None:
        if not b.state.cleared:
            b.emit(g.GoalCleared(goal_id=b.goal_id), "state:absent")
        return b
    rt = rt or _empty_runtime(b.goal_id)
    fill_turns(b, rt, rt.run_count + 1, final=True)
    correct(b, snap, rt)
    return b


def _empty_runtime(goal_id: str) -> RefRuntime:
    from .source import RefRuntime

    return RefRuntime(goal_id=goal_id)


def _create(b: GoalBuilder, data: GoalInput, line: LedgerLine | None) -> bool:
    snap = data.goal
    if line is None and snap is None:
        b.warnings.append(
            f"goal {b.goal_id}: the ledger has no goal.created line and state.json no record; "
            f"its {len(data.lines)} ledger line(s) were left out"
        )
        return False
    config, at = g.GoalConfig(), ""
    name = objective = owner = ""
    parent_model = parent_agent = None
    if snap is not None:
        config = _config(snap, data.lines)
        name, objective, owner, at = snap.name, snap.objective, snap.owner_session_id, snap.created_at
        parent_model, parent_agent = snap.parent_model, snap.parent_agent
    source = "state:goal"
    if line is not None:
        fields = typed(line, LGoalCreated, data.ledger_path)
        name, objective, owner, at = fields.name, fields.objective, fields.owner_session_id, line.timestamp
        source = f"ledger:{line.line}"
    b.emit(
        g.GoalCreated(
            goal_id=b.goal_id,
            name=name,
            objective=objective,
            owner_session_id=owner,
            config=config,
            parent_model=parent_model,
            parent_agent=parent_agent,
            at=at,
        ),
        source,
    )
    if snap is not None and snap.worker_session_id:
        b.emit(
            g.GoalWorkerAssigned(
                goal_id=b.goal_id,
                worker_session_id=snap.worker_session_id,
                topology=snap.worker_topology,
                native_parent_id=snap.native_parent_id,
            ),
            "state:goal.workerSessionID",
        )
    return True


def _config(snap: RefGoal, lines: tuple[LedgerLine, ...]) -> g.GoalConfig:
    """The configuration at creation: today's, with the model/agent before their last switch."""
    c = snap.config
    model, agent = c.model, c.agent
    last_model = snap.model_switch.last if snap.model_switch else None
    if last_model is not None and last_model.to == c.model and last_model.from_:
        model = last_model.from_
    last_agent = snap.agent_switch.last if snap.agent_switch else None
    if last_agent is not None and last_agent.to == c.agent and last_agent.from_:
        agent = last_agent.from_
    first_toggle = next((ln for ln in lines if ln.type == "goal.interactive_changed"), None)
    interactive = bool(snap.interactive)
    if first_toggle is not None:
        interactive = not bool(first_toggle.fields.get("interactive"))
    schedule = g.Schedule(every_ms=c.schedule.every_ms, max_runs=c.schedule.max_runs) if c.schedule else None
    return g.GoalConfig(
        model=model,
        agent=agent,
        fallback_models=tuple(c.fallback_models or ()),
        checks=tuple(c.checks or ()),
        check_cwd=c.check_cwd,
        workspace_write=True if c.workspace_write is None else c.workspace_write,
        schedule=schedule,
        interactive=interactive,
        max_turns=c.max_turns,
        max_failures=c.max_failures,
        max_evaluator_rejections=c.max_evaluator_rejections,
        max_no_progress=c.max_no_progress,
        token_budget=snap.token_budget,
        cost_budget=snap.cost_budget,
        compact_every=c.compact_every,
        timeout_ms=c.timeout_ms,
        progress_file=c.progress_file,
        artifact_dir=c.artifact_dir,
    )


# -- step 2: the ledger -----------------------------------------------------------------------------


def _ledger(b: GoalBuilder, data: GoalInput, line: LedgerLine, free_next: bool) -> bool:
    """Emit the event of one ledger line; returns whether the next run is a free retry."""
    t, ts, gid, src, where = line.type, line.timestamp, b.goal_id, f"ledger:{line.line}", data.ledger_path
    s = b.state
    if t == "goal.status_changed":
        ch = typed(line, LStatusChanged, where)
        ev: Event
        if ch.to == "paused":
            ev = g.GoalPaused(goal_id=gid)
        elif ch.to == "active" and ch.from_ == "blocked":
            ev = g.GoalRetried(goal_id=gid)
        elif ch.to == "active":
            ev = g.GoalResumed(goal_id=gid, from_status=ch.from_)
        else:
            ev = g.GoalStatusChanged(goal_id=gid, from_status=ch.from_, to_status=ch.to)
        b.emit(ev, src)
    elif t == "goal.progress":
        p = typed(line, LProgress, where)
        b.emit(g.GoalProgressReported(goal_id=gid, summary=p.summary, next=p.next, at=ts), src)
    elif t == "goal.completed":
        c = typed(line, LCompleted, where)
        b.emit(g.GoalCompleted(goal_id=gid, summary=c.summary, evidence=c.evidence, at=ts), src)
    elif t == "goal.blocked":
        bl = typed(line, LBlocked, where)
        reason, needed, kind = bl.reason, bl.needed, None
        last_blocked = [ln for ln in data.lines if ln.type == "goal.blocked"][-1]
        snap = data.goal
        if (
            line is last_blocked
            and snap is not None
            and snap.status == "blocked"
            and snap.blocker is not None
        ):
            # the ledger text of some blocks differs from the persisted blocker (§4.1); the state is authoritative
            reason, needed, kind = snap.blocker.reason, snap.blocker.needed, snap.blocker.kind
        b.emit(g.GoalBlocked(goal_id=gid, reason=reason, needed=needed, kind=kind, at=ts), src)
    elif t == "goal.cleared":
        b.emit(g.GoalCleared(goal_id=gid), src)
    elif t == "goal.completion_rejected":
        rej = typed(line, LRejected, where)
        limit = s.config.max_evaluator_rejections or DEFAULT_MAX_REJECTIONS
        free = rej.rejection_count < limit
        b.emit(
            g.GoalCompletionRejected(
                goal_id=gid,
                attempt_id=rej.attempt_id,
                rejection_count=rej.rejection_count,
                failed_check_count=rej.failed_check_count,
                failure_summary=rej.failure_summary,
                details=rej.failure_summary,
                free_retry=free,
            ),
            src,
        )
        return free
    elif t == "goal.interactive_changed":
        b.emit(
            g.GoalInteractiveChanged(goal_id=gid, interactive=typed(line, LInteractive, where).interactive),
            src,
        )
    elif t == "run.started":
        run = typed(line, LRun, where)
        turn = run.turn_count if run.turn_count is not None else s.run_count + 1
        if turn > s.run_count + 1:
            fill_turns(b, data.runtime, turn, final=False)
        start_run(b, data.runtime, run.run_id, turn, charged=not free_next, at=ts, source=src)
        return False
    elif t in ("run.completed", "run.recovered", "run.stuck"):
        run = typed(line, LRun, where)
        gen = s.run_generation
        if t == "run.completed":
            b.emit(r.RunCompleted(goal_id=gid, run_id=run.run_id, generation=gen), src)
        elif t == "run.recovered":
            b.emit(
                r.RunRecovered(
                    goal_id=gid,
                    run_id=run.run_id,
                    quiet_seconds=run.quiet_seconds or 0.0,
                    cleared_tool_calls=run.cleared_tool_calls or 0,
                    generation=gen,
                ),
                src,
            )
        else:
            b.emit(
                r.RunStuck(
                    goal_id=gid, run_id=run.run_id, stuck_seconds=run.stuck_seconds or 0.0, generation=gen
                ),
                src,
            )
    elif t == "run.failed":
        run = typed(line, LRun, where)
        failures = (
            run.consecutive_failures if run.consecutive_failures is not None else s.consecutive_failures + 1
        )
        retry_after = None
        if failures < (s.config.max_failures or DEFAULT_MAX_FAILURES):
            retry_after = _backoff(ts, failures)
        b.emit(
            r.RunFailed(
                goal_id=gid,
                run_id=run.run_id,
                error=run.error or "",
                consecutive_failures=failures,
                retry_after=retry_after,
            ),
            src,
        )
    elif t == "idle.confirm-failed":
        cf = typed(line, LConfirmFailed, where)
        b.emit(
            r.RunConfirmFailed(
                goal_id=gid, generation=s.run_generation, reason=cf.reason, run_id=s.active_run_id
            ),
            src,
        )
    elif t == "schedule.tick":
        if s.status == "complete":
            b.emit(g.GoalResumed(goal_id=gid, from_status="complete", by="schedule"), src)
    elif t not in NOT_MODELLED:
        b.warnings.append(f"goal {gid}: {src} has type {t!r}, which this import does not know; left out")
    return free_next


def _backoff(timestamp: str, failures: int) -> str | None:
    """The reference's retry deadline: ``min(30 s, 2^n s)`` after the failure (§2.2)."""
    try:
        at = parse_rfc3339(timestamp)
    except ValueError:
        return None
    deadline = at + timedelta(milliseconds=min(30_000, 1000 * 2**failures))
    return deadline.isoformat(timespec="milliseconds").replace("+00:00", "Z")
