"""``decide(command, state, facts) -> list[Event]``: the goal rules of docs/reference/loopd.md#s3, pure.

A command that breaks a rule raises :class:`~loopd_es.domain.rules.RuleError` (a ``DomainError``) with the
reference's message and changes nothing. A command that the reference answers with a silent no-op (pausing
a goal that is not active, a stale idle confirmation) returns ``[]``. Identity and provider-limit decisions
live in :mod:`loopd_es.domain.switching`, the engine's records of turns (idle candidates, watchdogs, compaction,
workers, inbox delivery) in :mod:`loopd_es.domain.engine_rules`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime
from typing import Any, Final

from ..clock import iso, whole_ms
from ..events import goal as g
from ..events import run as r
from ..events.base import Event
from . import engine_rules, switching
from . import goal_commands as c
from .rules import (
    DEFAULT_MAX_FAILURES,
    DEFAULT_MAX_REJECTIONS,
    DEFAULT_TIMEOUT_MS,
    MAX_FALLBACK_MODELS,
    MAX_SCHEDULE_EVERY_MS,
    BadArgument,
    RuleError,
    after_ms,
    assert_writer_slot,
    backoff_ms,
    clean_list,
    clean_text,
    invalid_model,
    is_model_ref,
    js_number,
    require_goal,
    run_in_time,
    stale_run,
    unusable_model,
    writer_conflict,
)
from .state import GoalState

_Decider = Callable[[Any, GoalState, c.Facts], list[Event]]
_DECIDERS: Final[dict[type, _Decider]] = {}


def _on(cls: type) -> Callable[[_Decider], _Decider]:
    def register(fn: _Decider) -> _Decider:
        _DECIDERS[cls] = fn
        return fn

    return register


def decide(command: c.GoalCommand, state: GoalState, facts: c.Facts) -> list[Event]:
    """The events that ``command`` produces on ``state`` given ``facts``.

    :raises DomainError: when the command breaks a rule; nothing is to be appended then.
    """
    kind = type(command)
    decider = _DECIDERS.get(kind) or switching.DECIDERS.get(kind) or engine_rules.DECIDERS.get(kind)
    if decider is None:
        raise TypeError(f"no decider for {type(command).__name__}")
    return decider(command, state, facts)


# -- create -------------------------------------------------------------------------------------------


@_on(c.CreateGoal)
def _create(cmd: c.CreateGoal, state: GoalState, facts: c.Facts) -> list[Event]:
    owner = cmd.owner_session_id
    if not owner or owner == "main":
        raise BadArgument(
            "A valid owner session is required. Run /goal from an active OpenCode session.",
            "invalid_owner_session",
        )
    every = cmd.schedule_every_ms
    if every is not None and not (math.isfinite(every) and every >= 1000):
        raise BadArgument("scheduleEveryMs must be a number >= 1000", "invalid_schedule")
    if every is not None and every > MAX_SCHEDULE_EVERY_MS:
        raise BadArgument(
            f"scheduleEveryMs must be at most {MAX_SCHEDULE_EVERY_MS} (100 years)", "invalid_schedule"
        )
    runs = cmd.schedule_max_runs
    if runs is not None and not (math.isfinite(runs) and float(runs).is_integer() and runs >= 1):
        raise BadArgument("scheduleMaxRuns must be an integer >= 1", "invalid_schedule")
    if runs is not None and every is None:
        raise BadArgument("scheduleMaxRuns requires scheduleEveryMs", "invalid_schedule")
    if cmd.cost_budget is not None and not (math.isfinite(cmd.cost_budget) and cmd.cost_budget > 0):
        raise BadArgument("costBudget must be a positive number of dollars", "invalid_cost_budget")
    defaults = facts.defaults
    agent = clean_text(cmd.agent) or clean_text(
        defaults.agent
    )  # trimmed; blank is absent (reference cleanText)
    model = clean_text(cmd.model) or clean_text(defaults.model)
    if model is not None and not is_model_ref(model):
        raise BadArgument(invalid_model(model, long=True), "invalid_model")
    catalog = facts.model_catalog
    if model is not None and catalog is not None and catalog.capability == "supported":
        if not catalog.usable(model):  # refused here: the worker's creation would fail naming no model
            raise BadArgument(unusable_model(model), "invalid_model")
    writer = True if cmd.workspace_write is None else cmd.workspace_write
    explicit = clean_list(cmd.checks or ())  # blank checks are none: the default ones run
    configured = defaults.checks if defaults.checks is not None else ("bun test",)  # [] configured stays []
    default_checks = clean_list(configured) if writer else ()
    checks = explicit or default_checks
    if writer and not checks:
        raise BadArgument(
            "Workspace-writing goals require completion checks. Pass checks or configure plugin option "
            "defaultChecks.",
            "missing_checks",
        )
    fallbacks = _validate_fallbacks(cmd.fallback_models or (), facts)
    if state.exists or state.cleared:
        raise RuleError(f"goal {cmd.goal_id} {'was cleared' if state.cleared else 'already exists'}")
    if writer:
        for other in facts.active_writers:
            raise RuleError(writer_conflict(other.name, other.goal_id, other.owner_session_id, owner))
    artifact_dir = f"{defaults.directory.rstrip('/')}/.opencode/loopd/goals/{cmd.goal_id}"
    schedule = (
        g.Schedule(every_ms=int(every), max_runs=int(runs) if runs is not None else None) if every else None
    )
    config = g.GoalConfig(
        model=model,
        agent=agent,
        fallback_models=fallbacks,
        checks=checks,
        check_cwd=cmd.check_cwd or (defaults.directory if writer else None),
        workspace_write=writer,
        schedule=schedule,
        interactive=cmd.interactive,
        max_turns=50 if cmd.max_turns is None else cmd.max_turns,
        max_failures=cmd.max_failures,
        max_evaluator_rejections=cmd.max_evaluator_rejections,
        max_no_progress=cmd.max_no_progress,
        token_budget=cmd.token_budget,
        cost_budget=cmd.cost_budget,
        compact_every=cmd.compact_every,
        timeout_ms=cmd.timeout_ms,
        progress_file=cmd.progress_file or f"{artifact_dir}/progress.md",
        artifact_dir=artifact_dir,
    )
    return [
        g.GoalCreated(
            goal_id=cmd.goal_id,
            name=cmd.name,
            objective=cmd.objective,
            owner_session_id=owner,
            config=config,
            at=whole_ms(facts.now),
        )
    ]


def _validate_fallbacks(models: tuple[str, ...], facts: c.Facts) -> tuple[str, ...]:
    if len(models) > MAX_FALLBACK_MODELS:
        raise BadArgument(f"At most {MAX_FALLBACK_MODELS} ordered fallback models are allowed.")
    catalog = facts.model_catalog
    for raw in models:
        value = raw.strip()
        if not value:
            raise BadArgument("Fallback model must be providerID/modelID.")
        if not is_model_ref(value):
            raise BadArgument(invalid_model(raw))
        if catalog is not None and catalog.capability == "supported" and not catalog.usable(value):
            raise BadArgument(unusable_model(value, "Fallback model"))
    return tuple(dict.fromkeys(m.strip() for m in models))


# -- owner controls -----------------------------------------------------------------------------------


@_on(c.PauseGoal)
def _pause(cmd: c.PauseGoal, state: GoalState, facts: c.Facts) -> list[Event]:
    require_goal(state, cmd.caller)
    if state.status != "active":
        return []
    return [g.GoalPaused(goal_id=state.goal_id)]


@_on(c.ResumeGoal)
def _resume(cmd: c.ResumeGoal, state: GoalState, facts: c.Facts) -> list[Event]:
    require_goal(state, cmd.caller, "No matching paused/blocked goal for this session.")
    if state.status == "active":
        return []
    assert_writer_slot(state, facts, cmd.caller or state.owner_session_id)
    return [g.GoalResumed(goal_id=state.goal_id, from_status=state.status)]


@_on(c.RetryGoal)
def _retry(cmd: c.RetryGoal, state: GoalState, facts: c.Facts) -> list[Event]:
    require_goal(state, cmd.caller, "No matching paused/blocked goal for this session.")
    if state.status != "blocked":
        return []
    assert_writer_slot(state, facts, cmd.caller or state.owner_session_id)
    return [g.GoalRetried(goal_id=state.goal_id)]


@_on(c.ClearGoal)
def _clear(cmd: c.ClearGoal, state: GoalState, facts: c.Facts) -> list[Event]:
    require_goal(state, cmd.caller)
    return [g.GoalCleared(goal_id=state.goal_id)]


@_on(c.NudgeGoal)
def _nudge(cmd: c.NudgeGoal, state: GoalState, facts: c.Facts) -> list[Event]:
    require_goal(state, cmd.caller)
    if state.status != "active":
        raise RuleError(f"Goal is {state.status}; resume or retry it before nudging.")
    if state.worker_session_id is None:
        raise RuleError("Goal has no worker session. Use resume_goal or retry_goal.")
    return [g.GoalNudged(goal_id=state.goal_id)]


@_on(c.SendInput)
def _send(cmd: c.SendInput, state: GoalState, facts: c.Facts) -> list[Event]:
    if not cmd.text.strip():
        raise RuleError("Nothing to send.", "bad_request")
    require_goal(state, cmd.caller)
    events: list[Event] = [
        g.GoalInputQueued(goal_id=state.goal_id, input_id=cmd.input_id, text=cmd.text, at=whole_ms(facts.now))
    ]
    if state.status == "active" and state.worker_session_id is not None:
        events.append(g.GoalNudged(goal_id=state.goal_id, bare=True))
    return events


@_on(c.SetInteractive)
def _interactive(cmd: c.SetInteractive, state: GoalState, facts: c.Facts) -> list[Event]:
    require_goal(state, cmd.caller)
    return [g.GoalInteractiveChanged(goal_id=state.goal_id, interactive=cmd.interactive)]


@_on(c.AbortWorker)
def _abort(cmd: c.AbortWorker, state: GoalState, facts: c.Facts) -> list[Event]:
    require_goal(state, cmd.caller)
    if state.worker_session_id is None:
        raise RuleError(f'Goal "{state.name}" has no worker session to abort.')
    return [g.GoalWorkerAborted(goal_id=state.goal_id, at=whole_ms(facts.now))]


@_on(c.RecordWorkerFailure)
def _worker_failure(cmd: c.RecordWorkerFailure, state: GoalState, facts: c.Facts) -> list[Event]:
    if not state.exists:
        return []
    cfg = state.config  # the host's refusal seldom says what it refused: name the identity asked for
    identity = f"model {cfg.model or 'the host default'}, agent {cfg.agent or 'the host default'}"
    detail = f"{cmd.detail} (worker {identity})"
    return [
        g.GoalBlocked(
            goal_id=state.goal_id,
            reason=detail,
            last_error=detail,
            source="worker_create",
            needed="Start the goal again from a valid OpenCode session after correcting the worker creation error.",
            at=whole_ms(facts.now),
        )
    ]


@_on(c.ForceComplete)
def _force_complete(cmd: c.ForceComplete, state: GoalState, facts: c.Facts) -> list[Event]:
    require_goal(state, cmd.caller)
    if state.status == "complete":
        raise RuleError(f'Goal "{state.name}" already complete.')
    return [
        g.GoalCompleted(
            goal_id=state.goal_id,
            summary=cmd.summary,
            evidence=cmd.evidence,
            forced=True,
            at=whole_ms(facts.now),
        )
    ]


@_on(c.ForceBlock)
def _force_block(cmd: c.ForceBlock, state: GoalState, facts: c.Facts) -> list[Event]:
    require_goal(state, cmd.caller)
    if state.status == "blocked":
        raise RuleError(f'Goal "{state.name}" already blocked.')
    return [
        g.GoalBlocked(
            goal_id=state.goal_id,
            reason=cmd.reason,
            needed=cmd.needed,
            source="owner",
            at=whole_ms(facts.now),
        )
    ]


# -- worker tools -------------------------------------------------------------------------------------


@_on(c.ReportProgress)
def _progress(cmd: c.ReportProgress, state: GoalState, facts: c.Facts) -> list[Event]:
    if not state.exists or state.status not in ("active", "blocked"):
        raise RuleError("No active goal to report progress for.")
    if state.status != "active":
        raise RuleError(f"Goal is {state.status}, not active. Cannot report progress.")
    return [
        g.GoalProgressReported(
            goal_id=state.goal_id,
            summary=cmd.summary,
            next=cmd.next,
            evidence=cmd.evidence,
            at=whole_ms(facts.now),
        )
    ]


@_on(c.BlockGoal)
def _block(cmd: c.BlockGoal, state: GoalState, facts: c.Facts) -> list[Event]:
    if not state.exists or state.status != "active":
        raise RuleError(f"Cannot block goal in {state.status if state.exists else 'missing'} state.")
    return [
        g.GoalBlocked(
            goal_id=state.goal_id,
            reason=cmd.reason,
            needed=cmd.needed,
            source="worker",
            at=whole_ms(facts.now),
        )
    ]


@_on(c.CompleteGoal)
def _complete(cmd: c.CompleteGoal, state: GoalState, facts: c.Facts) -> list[Event]:
    if not state.exists or state.status not in ("active", "blocked"):
        raise RuleError("No active goal to complete.")
    if state.status != "active":
        raise RuleError(f"Cannot complete goal in {state.status} state.")
    failures = tuple(
        g.CheckFailure(command=x.command, exit_code=x.exit_code, stderr=x.stderr, stdout=x.stdout)
        for x in cmd.check_results
        if x.exit_code != 0
    )
    now = whole_ms(facts.now)
    if not failures:
        return [
            g.GoalCompleted(
                goal_id=state.goal_id,
                summary=cmd.summary,
                evidence=cmd.evidence,
                at=now,
                next_run_at=_next_run_at(state, facts),
            )
        ]
    count = state.evaluator_rejection_count + 1
    limit = state.config.max_evaluator_rejections or DEFAULT_MAX_REJECTIONS
    cwd = cmd.cwd or state.config.check_cwd or state.config.artifact_dir or ""
    text = "\n\n".join(_failure_text(f) for f in failures)
    events: list[Event] = [
        g.GoalCompletionRejected(
            goal_id=state.goal_id,
            attempt_id=cmd.attempt_id,
            rejection_count=count,
            failed_check_count=len(failures),
            failure_summary=text[:500],
            details=f"Rejection #{count} at {iso(now)}\n\nWorking directory: {cwd}\n\n{text}",
            failures=failures,
            cwd=cwd,
            free_retry=count < limit,
        )
    ]
    if count >= limit:
        events.append(
            g.GoalBlocked(
                goal_id=state.goal_id,
                reason=f"Evaluator rejected {count} time(s). Last failure:\n{text[:500]}",
                needed="Fix the failing checks and retry the goal.",
                source="evaluator",
                at=now,
            )
        )
    return events


def _failure_text(f: g.CheckFailure) -> str:
    parts = [f"$ {f.command} (exit {f.exit_code})"]
    if f.stderr:
        parts.append(f"stderr: {f.stderr}")
    if f.stdout:
        parts.append(f"stdout: {f.stdout}")
    return "\n".join(parts)


def _next_run_at(state: GoalState, facts: c.Facts) -> datetime | None:
    schedule = state.config.schedule
    if schedule is None or schedule.every_ms < 1000:
        return None
    count = state.schedule_run_count + 1
    if schedule.max_runs is not None and count >= schedule.max_runs:
        return None
    return whole_ms(after_ms(facts.now, schedule.every_ms))


# -- usage, runs, limits ------------------------------------------------------------------------------


@_on(c.AccountUsage)
def _account(cmd: c.AccountUsage, state: GoalState, facts: c.Facts) -> list[Event]:
    if not state.exists:
        return []
    seen = set(state.accounted_message_ids)
    ids: list[str] = []
    tokens, cost, seconds = 0, 0.0, 0.0
    for m in cmd.messages:
        if m.role != "assistant" or not m.completed or not m.message_id or m.message_id in seen:
            continue
        seen.add(m.message_id)
        ids.append(m.message_id)
        tokens += m.input + m.output + m.reasoning + m.cache_read + m.cache_write
        cost += m.cost
        seconds += m.duration_ms / 1000
    if not ids:
        return []
    return [
        g.GoalUsageAccounted(
            goal_id=state.goal_id,
            message_ids=tuple(ids),
            token_delta=tokens,
            cost_delta=cost,
            time_delta_seconds=seconds,
        )
    ]


@_on(c.StartRun)
def _start_run(cmd: c.StartRun, state: GoalState, facts: c.Facts) -> list[Event]:
    if not state.exists or state.status != "active":
        return []
    if state.phase == "running" and run_in_time(state, facts.now):
        return []
    if state.switch_in_flight is not None:  # the prompt would carry the identity being replaced (#10.2)
        return []
    timeout = state.config.timeout_ms or DEFAULT_TIMEOUT_MS
    # the wrap-up turn a reached limit asked for is a force-finish turn whoever starts it
    # (docs/reference/loopd.md#s3-13)
    kind: r.RunKind = "force_finish" if state.force_finish_requested and cmd.kind == "steer" else cmd.kind
    return [
        r.RunStarted(
            goal_id=state.goal_id,
            run_id=cmd.run_id,
            generation=state.run_generation + 1,
            prompt_message_id=cmd.prompt_message_id,
            turn_count=state.run_count + 1,
            charged=not state.free_retry_pending,
            kind=kind,
            deadline=whole_ms(after_ms(facts.now, timeout)),
            at=whole_ms(facts.now),
        )
    ]


@_on(c.RecordRunFailure)
def _run_failure(cmd: c.RecordRunFailure, state: GoalState, facts: c.Facts) -> list[Event]:
    if not state.exists or state.status != "active":
        return []
    if stale_run(cmd.run_id, cmd.generation, state):
        # a late error of an earlier run: the current turn is not failed by it (docs/reference/loopd.md#s2-3)
        return []
    failures = state.consecutive_failures + 1
    blocked = cmd.block_immediately or failures >= (state.config.max_failures or DEFAULT_MAX_FAILURES)
    wait = backoff_ms(failures, facts.backoff.base_ms, facts.backoff.cap_ms)
    retry_after = None if blocked else whole_ms(after_ms(facts.now, wait))
    events: list[Event] = [
        r.RunFailed(
            goal_id=state.goal_id,
            run_id=state.active_run_id or "unknown",
            error=cmd.error_text,
            consecutive_failures=failures,
            retry_after=retry_after,
            source=cmd.source,
            generation=state.run_generation,
            at=whole_ms(facts.now),
        )
    ]
    if blocked:
        if cmd.source == "session-error":
            reason = f"Failed {failures} times. Last error: {cmd.error_text}"
            needed = "User intervention required. Use retry to attempt again."
        else:
            reason = f"Worker prompt delivery failed: {cmd.error_text}"
            needed = (
                "Retry after the OpenCode worker/session API is available."
                if cmd.block_immediately
                else "Fix the underlying error and use retry_goal to attempt again."
            )
        events.append(
            g.GoalBlocked(
                goal_id=state.goal_id,
                reason=reason,
                needed=needed,
                source=cmd.source,
                last_error=cmd.error_text,
                at=whole_ms(facts.now),
                failures=failures,
            )
        )
    return events


@_on(c.ConfirmIdle)
def _confirm_idle(cmd: c.ConfirmIdle, state: GoalState, facts: c.Facts) -> list[Event]:
    if (
        not state.exists
        or state.status != "active"
        or state.phase != "running"
        or state.active_run_id != cmd.run_id
        or state.run_generation != cmd.generation
    ):
        return []
    events: list[Event] = [
        r.RunCompleted(goal_id=state.goal_id, run_id=cmd.run_id, generation=cmd.generation)
    ]
    return events + limit_events(state, facts)


def limit_events(state: GoalState, facts: c.Facts) -> list[Event]:
    """docs/reference/loopd.md#s3-13 at an idle confirmation (``state`` is the goal before the run's
    completion is folded):
    the first limit that holds, or nothing."""
    cfg = state.config
    force_reason = None
    idle_turns = state.no_progress_count + (0 if state.progress_during_turn else 1)  # this turn's too
    if cfg.max_turns and state.budget_turn_count >= cfg.max_turns:
        force_reason = f"Reached max turns ({cfg.max_turns})"
    elif cfg.max_no_progress and idle_turns >= cfg.max_no_progress:
        force_reason = f"No progress for {idle_turns} consecutive turns"
    if force_reason is not None:
        if state.force_finish_requested:
            return [
                g.GoalBlocked(
                    goal_id=state.goal_id,
                    reason=f"{force_reason} (force-finish ignored)",
                    needed="User intervention required. Use retry to attempt again.",
                    at=whole_ms(facts.now),
                )
            ]
        return [g.GoalForceFinishRequested(goal_id=state.goal_id, reason=force_reason)]
    reason = _budget_reason(state, prefer_cost=False)
    if reason is not None:
        return [
            g.GoalBudgetExhausted(
                goal_id=state.goal_id, reason=reason, tokens_used=state.tokens_used, cost_used=state.cost_used
            )
        ]
    return []


@_on(c.EnforceBudget)
def _enforce_budget(cmd: c.EnforceBudget, state: GoalState, facts: c.Facts) -> list[Event]:
    if not state.exists or state.status != "active":
        return []
    reason = _budget_reason(state, prefer_cost=True)
    if reason is None:
        return []
    return [
        g.GoalBudgetExhausted(
            goal_id=state.goal_id,
            reason=reason,
            tokens_used=state.tokens_used,
            cost_used=state.cost_used,
            worker_aborted=True,
        )
    ]


def _budget_reason(state: GoalState, *, prefer_cost: bool) -> str | None:
    cfg = state.config
    token = (
        f"Token budget exhausted ({state.tokens_used}/{cfg.token_budget})"
        if cfg.token_budget and state.tokens_used >= cfg.token_budget
        else None
    )
    cost = (
        f"Cost budget exhausted (${state.cost_used:.4f}/${js_number(cfg.cost_budget)})"
        if cfg.cost_budget is not None and state.cost_used >= cfg.cost_budget
        else None
    )
    if prefer_cost:
        return cost or token
    return token or cost
