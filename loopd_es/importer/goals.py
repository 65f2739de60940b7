"""Map one loopd goal (its ledger lines and its state snapshot) to the events of its ``goal-<id>`` stream.

The ledger has the history but is lossy (docs/reference/loopd.md#s4-1: appended after the state write, many
mutations
emit nothing); ``state.json`` is authoritative but has no history. So the stream is built in three steps,
folding through :func:`loopd_es.domain.evolve.evolve` as it goes:

1. ``goal.created`` (from its ledger line when there is one, with the configuration from the snapshot)
   and the worker assignment;
2. every ledger line, in file order; a line that does not apply (a stale run, say) or has no loopd-es
   fact is skipped and reported with its line number and reason (nothing is dropped silently);
3. corrections synthesised from the snapshot wherever the fold still differs from it
   (:mod:`.corrections`), then ``goal.runtime_imported``: the snapshot's counters and bookkeeping.

Runs the ledger lost are not made up: ``runCount``/``budgetTurnCount`` come from the snapshot as they are
(two counters, never merged), and the ledger's runs keep their own ids and times. The stream is built
twice so the last run's generation is the snapshot's ``runGeneration``. Whatever still differs afterwards
(fields no event can set) is reported by :func:`.check.differences`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Final

import msgspec

from ..clock import iso, later, parse_or_none, parse_rfc3339
from ..events import goal as g
from ..events import run as r
from ..events.imported import CheckResult, GoalRuntimeImported, VerificationAttempt
from .builder import Emitted, GoalBuilder, Report, Sourced, exact, from_line, start_run
from .corrections import budget_event, correct
from .ledger import (
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
    from .ledger import LedgerLine
    from .source import RefGoal, RefRuntime

DEFAULT_MAX_FAILURES: Final = 5
DEFAULT_MAX_REJECTIONS: Final = 3


class GoalInput(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the import knows about one goal; ``goal`` is None when loopd no longer has it."""

    goal_id: str
    goal: RefGoal | None
    runtime: RefRuntime | None
    lines: tuple[LedgerLine, ...]
    ledger_path: Path
    controls: tuple[Control, ...] = ()
    """The goal's owner control requests (``state.commandLedger``) and the event id of each request."""


class Control(msgspec.Struct, frozen=True):
    """A control request and the id of its ``control.requested`` event (a pause's or resume's cause)."""

    command: str
    accepted_at: str
    completed_at: str
    event_id: str


def build_goal(data: GoalInput, report: Report) -> list[Emitted]:
    """The events of one goal's stream; built twice so the last run has the snapshot's ``runGeneration``.

    The first pass counts runs; the second starts generations where the count says the snapshot's
    ``runGeneration`` is reached by the last run (loopd bumps it for runs the ledger does not show).
    """
    first = _build(data, Report(), 0)
    rt = data.runtime
    if rt is None or data.goal is None:
        report.warnings.extend(first.report.warnings)
        report.skipped.extend(first.report.skipped)
        return first.items
    offset = max(0, rt.run_generation - first.runs)
    return _build(data, report, offset).items


def _build(data: GoalInput, report: Report, gen_offset: int) -> GoalBuilder:
    b = GoalBuilder(data.goal_id, report, gen_offset)
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
            last = b.items[-1].at if b.items else ""
            b.emit(g.GoalCleared(goal_id=b.goal_id), "state:absent", at=last, at_from="previous")
        return b
    rt = rt or _empty_runtime(b.goal_id)
    correct(b, snap, rt)
    ledger_runs = sum(1 for ln in data.lines if ln.type == "run.started")
    b.emit(
        _runtime(b, rt, ledger_runs),
        "state:runtime",
        at=rt.updated_at or snap.updated_at,
        at_from="state:runtime.updatedAt",
    )
    return b


def continue_goal(data: GoalInput, held: list[Emitted], report: Report, *, settled: bool) -> list[Emitted]:
    """The goal's stream with the ledger lines after those ``held`` already mirrored (a live mirror's step).

    ``held`` is the stream as the log has it; the builder is seeded by folding it, so each new line is
    mapped against the state the log shows, exactly as the one-shot import maps it against the lines
    before. The snapshot's corrections and counters follow only when ``settled``: loopd writes
    ``state.json`` a few milliseconds *before* the ledger line that says why, and correcting from a fresh
    snapshot would synthesise the fact that line is about to bring (the line would then not apply).
    Returns ``held`` followed by the new events.
    """
    b = GoalBuilder(data.goal_id, report, 0)
    free_next = False
    for item in held:
        b.seed(item)
        if isinstance(item.payload, g.GoalCompletionRejected):
            free_next = item.payload.free_retry
        elif isinstance(item.payload, r.RunStarted):
            free_next = False
    done = max((int(i.source[7:]) for i in held if i.source.startswith("ledger:")), default=0)
    lines = [ln for ln in data.lines if ln.line > done]
    created_line = next((ln for ln in lines if ln.type == "goal.created"), None)
    if not held:
        if created_line is None and not settled:
            return []  # its goal.created line is a moment behind the state write that shows it
        if not _create(b, data, created_line):
            return []
    for line in lines:
        if line is created_line and not held:
            continue
        if line.type == "goal.created":
            b.report.skip(f"goal {b.goal_id}", line, "the goal's stream was already started from state.json")
            continue
        free_next = _ledger(b, data, line, free_next)
    if settled:
        _settle(b, data, held)
    return b.items


def _settle(b: GoalBuilder, data: GoalInput, held: list[Emitted]) -> None:
    """Bring the fold to the snapshot: corrections, then the counters when they changed (or a clear)."""
    snap, rt = data.goal, data.runtime
    if snap is None:
        if not b.state.cleared:
            last = b.items[-1].at if b.items else ""
            b.emit(g.GoalCleared(goal_id=b.goal_id), "state:absent", at=last, at_from="previous")
        return
    rt = rt or _empty_runtime(b.goal_id)
    correct(b, snap, rt)
    ledger_runs = sum(1 for ln in data.lines if ln.type == "run.started")
    counters = _runtime(b, rt, ledger_runs)
    held_counters = next(
        (i.payload for i in reversed(b.items) if isinstance(i.payload, GoalRuntimeImported)), None
    )
    if counters != held_counters or len(b.items) > len(held):
        b.emit(
            counters, "state:runtime", at=rt.updated_at or snap.updated_at, at_from="state:runtime.updatedAt"
        )


def _runtime(b: GoalBuilder, rt: RefRuntime, ledger_runs: int) -> GoalRuntimeImported:
    attempts = list(rt.recent_verification_attempts)
    last = rt.last_verification_attempt
    if last is not None and all(a.id != last.id for a in attempts):
        attempts.append(last)  # loopd keeps the last one apart; it is the newest
    return GoalRuntimeImported(
        goal_id=b.goal_id,
        run_count=rt.run_count,
        budget_turn_count=rt.budget_turn_count,
        run_generation=rt.run_generation,
        no_progress_count=rt.no_progress_count,
        consecutive_failures=rt.consecutive_failures,
        schedule_run_count=rt.schedule_run_count,
        next_run_at=rt.next_run_at,
        last_schedule_at=rt.last_schedule_at,
        last_run_at=rt.last_run_at,
        last_compact_at=rt.last_compact_at,
        active_tool_call_ids=tuple(rt.active_tool_call_ids),
        last_parent_notified_at=rt.last_parent_notified_at,
        last_parent_notified_for=rt.last_parent_notified_for,
        last_worker_status=rt.last_worker_status,
        free_retry_pending=bool(rt.free_retry_pending),
        verification_attempts=tuple(
            VerificationAttempt(
                attempt_id=a.id,
                sequence=a.sequence,
                run_generation=a.run_generation,
                status=a.status,
                started_at=a.started_at,
                completed_at=a.completed_at,
                failed_checks=tuple(c.command for c in a.checks if c.exit_code not in (0, None)),
                claimed_summary=a.claimed_summary,
                claimed_evidence=a.claimed_evidence,
                cwd=a.cwd,
                checks=tuple(
                    CheckResult(command=c.command, exit_code=c.exit_code, stderr=c.stderr, stdout=c.stdout)
                    for c in a.checks
                ),
            )
            for a in attempts
        ),
        ledger_runs=ledger_runs,
        turn_started_at=rt.turn_started_at,
        last_error=rt.last_error,
        progress_during_turn=rt.progress_during_turn,
        turn_tokens_used=rt.turn_tokens_used,
        force_finish_requested=rt.force_finish_requested,
        stuck_notified_run_id=rt.stuck_notified_run_id,
        worker_aborted_at=rt.worker_aborted_at,
    )


def _empty_runtime(goal_id: str) -> RefRuntime:
    from .source import RefRuntime

    return RefRuntime(goal_id=goal_id)


def _create(b: GoalBuilder, data: GoalInput, line: LedgerLine | None) -> bool:
    snap = data.goal
    if line is None and snap is None:
        for orphan in data.lines:
            b.report.skip(
                f"goal {b.goal_id}",
                orphan,
                "the ledger has no goal.created line and state.json no record of the goal",
            )
        return False
    config, at = g.GoalConfig(), ""
    name = objective = owner = ""
    parent_model = parent_agent = None
    if snap is not None:
        config = _config(snap, data.lines)
        name, objective, owner, at = snap.name, snap.objective, snap.owner_session_id, snap.created_at
        parent_model, parent_agent = snap.parent_model, snap.parent_agent
    where: Sourced = {"source": "state:goal", "at": at, "at_from": "state:goal.createdAt"}
    if line is not None:
        fields = typed(line, LGoalCreated, data.ledger_path)
        name, objective, owner = fields.name, fields.objective, fields.owner_session_id
        where = exact(line, at, "state:goal.createdAt")
    b.emit(
        g.GoalCreated(
            goal_id=b.goal_id,
            name=name,
            objective=objective,
            owner_session_id=owner,
            config=config,
            parent_model=parent_model,
            parent_agent=parent_agent,
            at=parse_or_none(where.get("at", "")),
        ),
        **where,
    )
    if snap is not None and snap.worker_session_id:
        # the worker is created before loopd writes goal.created (docs/reference/loopd.md#s4-1): at the goal's
        # creation
        b.emit(
            g.GoalWorkerAssigned(
                goal_id=b.goal_id,
                worker_session_id=snap.worker_session_id,
                topology=snap.worker_topology,
                native_parent_id=snap.native_parent_id,
            ),
            "state:goal.workerSessionID",
            at=where.get("at", ""),
            at_from=where.get("at_from", ""),
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
        prompt_file=c.prompt_file,
        include_files=tuple(c.include_files or ()),
    )


# -- step 2: the ledger -----------------------------------------------------------------------------

_STARTERS: Final = (g.GoalCreated, g.GoalWorkerAssigned, g.GoalResumed, g.GoalRetried)
"""Events whose next turn they start (loopd's start, resume and retry call ``continueTurn`` at once)."""

_CONTROLLED: Final = {"paused": "pause", "active": "resume"}
"""Status changes an owner control request makes, by the status they lead to."""


def _control(data: GoalInput, line: LedgerLine, to: str) -> str | None:
    """The id of the control request behind a status line: same goal, handled within a minute before it."""
    wanted = ("retry",) if to == "retry" else (_CONTROLLED.get(to, ""),)
    try:
        ts = parse_rfc3339(line.timestamp)
    except ValueError:
        return None
    best = None
    for c in data.controls:
        if c.command not in wanted:
            continue
        try:
            accepted = parse_rfc3339(c.accepted_at)
        except ValueError:
            continue
        if accepted <= ts <= accepted + timedelta(seconds=60):
            best = c.event_id
    return best


def _ledger(b: GoalBuilder, data: GoalInput, line: LedgerLine, free_next: bool) -> bool:
    """Emit the event of one ledger line (or report it skipped); returns whether the next run is free."""
    t, ts, gid, where = line.type, line.timestamp, b.goal_id, data.ledger_path
    s = b.state
    kw = from_line(line)
    run = b.current_run()
    if t == "goal.status_changed":
        ch = typed(line, LStatusChanged, where)
        ev: Event
        cause: int | str | None
        if ch.to == "paused":
            ev, cause = g.GoalPaused(goal_id=gid), _control(data, line, "paused")
        elif ch.to == "active" and ch.from_ == "blocked":
            ev, cause = g.GoalRetried(goal_id=gid), _control(data, line, "retry")
        elif ch.to == "active":
            ev, cause = g.GoalResumed(goal_id=gid, from_status=ch.from_), _control(data, line, "active")
        elif ch.to == "budget_limited":
            ev, cause = budget_event(b, data.goal), None
        else:
            ev, cause = g.GoalStatusChanged(goal_id=gid, from_status=ch.from_, to_status=ch.to), None
        b.emit(ev, cause=cause, line=line, **kw)
    elif t == "goal.progress":
        p = typed(line, LProgress, where)
        lp = data.goal.last_progress if data.goal is not None else None
        if lp is not None and line is _last(data, t) and (lp.summary, lp.next) == (p.summary, p.next):
            kw = exact(line, lp.at, "state:goal.lastProgress.at")
        b.emit(
            g.GoalProgressReported(
                goal_id=gid, summary=p.summary, next=p.next, at=parse_or_none(kw.get("at") or ts)
            ),
            cause=run,
            line=line,
            **kw,
        )
    elif t == "goal.completed":
        c = typed(line, LCompleted, where)
        ev_ = data.goal.completion_evidence if data.goal is not None else None
        if (
            ev_ is not None
            and line is _last(data, t)
            and (ev_.summary, ev_.evidence) == (c.summary, c.evidence)
        ):
            kw = exact(line, ev_.at, "state:goal.completionEvidence.at")
        b.emit(
            g.GoalCompleted(
                goal_id=gid, summary=c.summary, evidence=c.evidence, at=parse_or_none(kw.get("at") or ts)
            ),
            cause=run,
            line=line,
            **kw,
        )
    elif t == "goal.blocked":
        bl = typed(line, LBlocked, where)
        reason, needed, kind = bl.reason, bl.needed, None
        snap = data.goal
        if (
            line is _last(data, t)
            and snap is not None
            and snap.status == "blocked"
            and snap.blocker is not None
        ):
            # the ledger text of some blocks differs from the persisted blocker
            # (docs/reference/loopd.md#s4-1); the state is authoritative
            reason, needed, kind = snap.blocker.reason, snap.blocker.needed, snap.blocker.kind
            kw = exact(line, snap.blocker.at, "state:goal.blocker.at")
        cause = b.last_failure if s.consecutive_failures else run
        b.emit(
            g.GoalBlocked(
                goal_id=gid, reason=reason, needed=needed, kind=kind, at=parse_or_none(kw.get("at") or ts)
            ),
            cause=cause,
            line=line,
            **kw,
        )
    elif t == "goal.cleared":
        if data.goal is not None:
            # loopd's unlocked writers can write a stale copy back after a clear
            # (docs/reference/loopd.md#s8-2, bug 1): state.json wins
            b.report.skip(
                f"goal {gid}", line, "state.json has the goal again after this clear (state.json wins)"
            )
        else:
            b.emit(g.GoalCleared(goal_id=gid), line=line, **kw)
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
            cause=run,
            line=line,
            **kw,
        )
        return free
    elif t == "goal.interactive_changed":
        b.emit(
            g.GoalInteractiveChanged(goal_id=gid, interactive=typed(line, LInteractive, where).interactive),
            line=line,
            **kw,
        )
    elif t == "run.started":
        lr = typed(line, LRun, where)
        turn = lr.turn_count if lr.turn_count is not None else s.run_count + 1
        index = start_run(b, data.runtime, lr.run_id, turn, charged=not free_next, line=line, **kw)
        if index is not None:
            _link_turn(b, index)
        return False
    elif t in ("run.completed", "run.recovered", "run.stuck"):
        lr = typed(line, LRun, where)
        gen, cause = s.run_generation, b.run_starts.get(lr.run_id)
        if t == "run.completed":
            ev = r.RunCompleted(goal_id=gid, run_id=lr.run_id, generation=gen)
        elif t == "run.recovered":
            ev = r.RunRecovered(
                goal_id=gid,
                run_id=lr.run_id,
                quiet_seconds=lr.quiet_seconds or 0.0,
                cleared_tool_calls=lr.cleared_tool_calls or 0,
                generation=gen,
            )
        else:
            ev = r.RunStuck(
                goal_id=gid, run_id=lr.run_id, stuck_seconds=lr.stuck_seconds or 0.0, generation=gen
            )
        if cause is None and lr.run_id != s.active_run_id:
            b.report.skip(
                f"goal {gid}", line, f"run {lr.run_id} has no run.started line and is not the running run"
            )
        else:
            b.emit(ev, cause=cause, line=line, **kw)
    elif t == "run.failed":
        lr = typed(line, LRun, where)
        failures = (
            lr.consecutive_failures if lr.consecutive_failures is not None else s.consecutive_failures + 1
        )
        retry_after = None
        if failures < (s.config.max_failures or DEFAULT_MAX_FAILURES):
            retry_after = _backoff(ts, failures)
        b.emit(
            r.RunFailed(
                goal_id=gid,
                run_id=lr.run_id,
                error=lr.error or "",
                consecutive_failures=failures,
                retry_after=parse_or_none(retry_after),
                generation=s.run_generation if lr.run_id == s.active_run_id else None,
            ),
            cause=b.run_starts.get(lr.run_id),
            line=line,
            **kw,
        )
    elif t == "idle.confirm-failed":
        cf = typed(line, LConfirmFailed, where)
        b.emit(
            r.RunConfirmFailed(
                goal_id=gid, generation=s.run_generation, reason=cf.reason, run_id=s.active_run_id
            ),
            cause=run,
            line=line,
            **kw,
        )
    elif t == "compaction.started":
        b.emit(g.GoalCompactionStarted(goal_id=gid, at=parse_or_none(ts)), line=line, **kw)
    elif t == "compaction.completed":
        b.emit(g.GoalCompactionCompleted(goal_id=gid, at=parse_or_none(ts)), line=line, **kw)
    elif t == "schedule.tick":
        if s.status == "complete":
            b.emit(g.GoalResumed(goal_id=gid, from_status="complete", by="schedule"), line=line, **kw)
        else:
            b.report.skip(
                f"goal {gid}", line, f"a schedule tick re-runs a complete goal; this one is {s.status}"
            )
    elif t == "runtime.phase_changed":
        b.report.skip(
            f"goal {gid}", line, "declared by loopd but never emitted; a phase is not a fact of its own here"
        )
    else:
        b.report.skip(f"goal {gid}", line, f"type {t!r} is not one this import knows")
    return free_next


def _last(data: GoalInput, type_: str) -> LedgerLine | None:
    """The goal's last ledger line of ``type_`` (the one the snapshot's value came from, when they agree)."""
    return next((ln for ln in reversed(data.lines) if ln.type == type_), None)


def _link_turn(b: GoalBuilder, index: int) -> None:
    """A turn that follows a start, resume or retry directly was started by it (not by an earlier turn)."""
    before = b.items[index - 1] if index else None
    if before is None or not isinstance(before.payload, _STARTERS) or later(before.at, b.items[index].at):
        return
    cause = 0 if isinstance(before.payload, g.GoalWorkerAssigned) else index - 1
    b.items[index] = msgspec.structs.replace(b.items[index], cause=cause)


def _backoff(timestamp: str, failures: int) -> str | None:
    """The reference's retry deadline: ``min(30 s, 2^n s)`` after the failure
    (docs/reference/loopd.md#s2-2)."""
    try:
        at = parse_rfc3339(timestamp)
    except ValueError:
        return None
    deadline = at + timedelta(milliseconds=min(30_000, 1000 * 2**failures))
    return iso(deadline)
