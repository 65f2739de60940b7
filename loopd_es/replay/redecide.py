"""Re-decide one goal's recorded decisions with the current deciders, under the recorded or a changed policy.

The recorded host observations (idle candidates, usage, run errors, provider limits, check results) are the
inputs; the decisions the engine made on them (run starts, idle confirmations and the limits checked there,
failures and their backoff, evaluator rejections, budget stops, fallbacks; the owner's controls and identity
switches, :mod:`.controls`) are what is compared. A decision is
re-made from the event that records it: the command is rebuilt from the event's own fields and the facts from
what the event and the ones appended with it say (the time, the catalog answers a fallback implies).

The first decision that comes out differently ends the replay of that goal: from there on the goal would have
taken another path, and the log holds no observations of that path. Pure: envelopes in, a report out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

import msgspec

from ..clock import iso, ms_between, parse_rfc3339, stamp, whole_ms
from ..domain import goal_commands as c
from ..domain.evolve import evolve, initial
from ..domain.rules import DEFAULT_MAX_FAILURES, after_ms, backoff_ms
from ..domain.state import GoalState
from ..domain.switching import observe_limit
from ..errors import InvalidEventError
from ..events import goal as g
from ..events import identity as i
from ..events import run as r
from ..events.base import Event
from ..events.catalogue import decode_payload
from ..events.envelope import Envelope
from ..events.imported import stamped
from .controls import CHECKS, remade
from .policy import Policy
from .remake import facts_for, now_of, remake
from .verdict import Divergence, Step, compare, describe, divergence

if TYPE_CHECKING:
    from ..events.envelope import Envelope

_TAILS: Final[dict[str, frozenset[str]]] = {
    "run.completed": frozenset({"goal.force_finish_requested", "goal.blocked", "goal.budget_exhausted"}),
    "run.failed": frozenset({"goal.blocked"}),
    "goal.completion_rejected": frozenset({"goal.blocked"}),
    "identity.provider_limit_observed": frozenset(
        {
            "identity.fallback_prepared",
            "identity.fallback_exhausted",
            "identity.fallback_unsupported",
            "identity.fallback_unavailable",
            "run.fell_back",
        }
    ),
}
"""The events a decider appends after the one that heads its decision (same append: same time and cause)."""


class GoalReplay(msgspec.Struct, kw_only=True):
    """One goal's replay: how many decisions were re-made, the first divergence, and what it would change."""

    goal_id: str
    name: str = ""
    events: int = 0
    decisions: int = 0
    divergence: Divergence | None = None
    applies_through: int = 0
    """The last position whose recorded observations still apply to the replayed goal."""
    recorded_turns: int = 0
    recorded_tokens: int = 0
    recorded_cost: float = 0.0
    saved_turns: int = 0
    saved_tokens: int = 0
    saved_cost: float = 0.0
    assumptions: list[str] = msgspec.field(default_factory=list)

    def beyond(self) -> str:
        """Where the recorded observations stop applying, in plain words."""
        d = self.divergence
        if d is None:
            return f"all {self.events} events replay; the recorded observations apply to the end"
        return (
            f"the recorded observations apply through position {self.applies_through}; past event "
            f"#{d.position} the goal would have taken a path the log did not record, so nothing further is replayed"
        )


class _Imported(msgspec.Struct):
    occurred_at: str | None = None
    imported: dict[str, Any] | None = None


_IMPORTED = msgspec.json.Decoder(_Imported)


def replay_goal_events(envs: Sequence[Envelope], policy: Policy | None = None) -> GoalReplay:
    """Re-decide every recorded decision of one goal stream (``envs``, in version order) under ``policy``."""
    policy = policy or Policy()
    goal_id = envs[0].stream.removeprefix("goal-") if envs else ""
    report = GoalReplay(goal_id=goal_id, events=len(envs))
    state = recorded = initial(goal_id)
    steps = _steps(envs)
    ctx = _Ctx(policy=policy, report=report)
    for n, step in enumerate(steps):
        if isinstance(step.event, r.RunIdleCandidate):
            ctx.candidates.append(
                (step.event.generation, step.event.at or parse_rfc3339(step.env.recorded_at))
            )
        if state.exists and state.name:
            report.name = state.name
        checker = _CHECKERS.get(step.env.type)
        divergence = None
        if checker is not None and state.exists and not step.correction and remade(step.event):
            report.decisions += 1
            divergence = checker(step, state, recorded, ctx)
        if divergence is None:
            for env, _ in ((step.env, step.event), *step.tail):
                state = _with_policy(evolve(state, env), policy)
                recorded = evolve(recorded, env)
            divergence = _after_usage(step, state, recorded, ctx)
        if divergence is not None:
            report.divergence = divergence
            report.applies_through = (
                step.env.position if divergence.event_type == "goal.usage_accounted" else _before(steps, n)
            )
            _count(report, steps, n, divergence)
            return report
        report.applies_through = (step.tail[-1][0] if step.tail else step.env).position
    _count(report, steps, len(steps), None)
    return report


def _before(steps: list[Step], n: int) -> int:
    return 0 if n == 0 else (steps[n - 1].tail[-1][0] if steps[n - 1].tail else steps[n - 1].env).position


def _with_policy(state: GoalState, policy: Policy) -> GoalState:
    config = policy.apply(state.config)
    return state if config == state.config else msgspec.structs.replace(state, config=config)


class _Unread(Event, frozen=True):
    """An event the replay does not look into (the fold reads it from its envelope)."""


_READ: Final = frozenset(
    {"run.idle_candidate", "goal.usage_accounted", "goal.retried", "goal.resumed", "goal.completed"}
    | {t for tails in _TAILS.values() for t in tails}
    | _TAILS.keys()
)


def _read(env: Envelope) -> Event:
    if env.type not in _READ and env.type not in _CHECKED:
        return _Unread()
    try:
        return decode_payload(env)
    except InvalidEventError:  # the fold keeps it as an anomaly; nothing to re-decide from
        return _Unread()


def _steps(envs: Sequence[Envelope]) -> list[Step]:
    """The stream cut into decisions: each head event with the events its decider appended with it.

    One append shares its time and cause; an import writes every line of a goal at once with a cause per line,
    so there the events that follow a head (of the types its decider appends) are its tail.
    """
    steps: list[Step] = []
    k = 0
    while k < len(envs):
        head = envs[k]
        mark = _IMPORTED.decode(head.data) if head.type in _TAILS or head.type in _CHECKED else None
        imported = mark is not None and mark.imported is not None
        tails = _TAILS.get(head.type, frozenset())
        tail: list[tuple[Envelope, Event]] = []
        k += 1
        while (
            k < len(envs)
            and envs[k].type in tails
            and envs[k].recorded_at == head.recorded_at
            and (imported or envs[k].causation_id == head.causation_id)
        ):
            tail.append((envs[k], _read(envs[k])))
            k += 1
        occurred = correction = None
        if mark is not None and mark.imported is not None:
            occurred = mark.occurred_at or head.recorded_at
            correction = str(mark.imported.get("source", "")).startswith("state:")
        steps.append(
            Step(
                env=head,
                event=_read(head),
                tail=tuple(tail),
                occurred_at=occurred,
                correction=bool(correction),
            )
        )
    return steps


def _count(report: GoalReplay, steps: list[Step], cut: int, d: Divergence | None) -> None:
    """The recorded totals, and what stopping at the divergence would save: the recorded turns after it (but the
    wrap-up turn a force-finish still grants), up to the owner's next retry or resume (which would come anyway)."""
    saving = d is not None and d.outcome == "stops_earlier"
    grace = d.grace_turns if d is not None else 0
    started_after = 0
    for n, step in enumerate(steps):
        for env, event in ((step.env, step.event), *step.tail):
            after = n > cut or (n == cut and env is not step.env)
            if after and isinstance(event, g.GoalRetried | g.GoalResumed):
                saving = False
            if isinstance(event, r.RunStarted):
                report.recorded_turns += 1
                if after and saving:
                    started_after += 1
            if isinstance(event, g.GoalUsageAccounted):
                report.recorded_tokens += event.token_delta
                report.recorded_cost += event.cost_delta
                provenance = stamped(env.data)[1]
                if provenance is not None and provenance.synthesised:  # a total an import filled in
                    if d is not None and d.outcome == "stops_earlier":
                        report.assumptions.append(
                            f"the usage at event #{env.position} ({event.token_delta} tokens, "
                            f"${event.cost_delta:.4f}) was filled in from state.json as one total, not per turn: "
                            "the tokens and cost saved leave it out"
                        )
                    continue
                if saving and after and started_after > grace:
                    report.saved_tokens += event.token_delta
                    report.saved_cost += event.cost_delta
    report.saved_turns = max(0, started_after - grace)


# -- the checks, one per decision kind -----------------------------------------------------------------


class _Ctx(msgspec.Struct, kw_only=True):
    policy: Policy
    report: GoalReplay
    candidates: list[tuple[int, datetime]] = msgspec.field(default_factory=list)
    """The idle candidates seen so far (generation, time), for the idle-window what-if."""


_Checker = Callable[[Step, GoalState, GoalState, _Ctx], Divergence | None]


def _start(step: Step, state: GoalState, recorded: GoalState, ctx: _Ctx) -> Divergence | None:
    e = step.event
    assert isinstance(e, r.RunStarted)
    cmd = c.StartRun(
        goal_id=state.goal_id, run_id=e.run_id, prompt_message_id=e.prompt_message_id, kind=e.kind
    )
    decided = remake(cmd, state, facts_for(ctx.policy, now_of(step, e.at)))
    if not decided or not isinstance(mine := decided[0], r.RunStarted):
        return compare(step, decided)
    if not e.deadline:  # a log from before deadlines were recorded
        decided[0] = mine = msgspec.structs.replace(mine, deadline=None)
    if not e.at:
        decided[0] = mine = msgspec.structs.replace(mine, at=None)
    if step.occurred_at is not None:
        lost = e.turn_count - mine.turn_count
        if lost > 0:  # the loopd ledger lost runs (docs/reference/loopd.md#s4-1): its own count says how many
            ctx.report.assumptions.append(
                f"the loopd ledger lost {lost} run(s) before event #{step.env.position}: loopd's turn count is kept"
            )
            decided[0] = msgspec.structs.replace(mine, turn_count=e.turn_count)
    return compare(step, decided)


def _confirm(step: Step, state: GoalState, recorded: GoalState, ctx: _Ctx) -> Divergence | None:
    e = step.event
    assert isinstance(e, r.RunCompleted)
    if ctx.policy.confirm_idle_ms is not None:
        early = _idle_window(step, state, ctx)
        if early is not None:
            return early
    blocked = next((t for _, t in step.tail if isinstance(t, g.GoalBlocked)), None)
    cmd = c.ConfirmIdle(
        goal_id=state.goal_id,
        run_id=e.run_id,
        generation=state.run_generation if e.generation is None else e.generation,
    )
    return compare(
        step, remake(cmd, state, facts_for(ctx.policy, now_of(step, blocked.at if blocked else None)))
    )


def _idle_window(step: Step, state: GoalState, ctx: _Ctx) -> Divergence | None:
    """Under another idle confirmation window: would the recorded confirmation come too soon, or too late?"""
    window_ms = ctx.policy.confirm_idle_ms or 0
    mine = [at for gen, at in ctx.candidates if gen == state.run_generation]
    if not mine:
        return None
    done = parse_rfc3339(step.env.recorded_at)
    for first, then in zip(mine, mine[1:], strict=False):
        quiet = ms_between(then, first)
        if quiet >= window_ms:
            return divergence(
                step,
                "confirm_idle_ms",
                f"idle again at {stamp(then)}",
                f"may confirm at {iso(after_ms(first, window_ms))}",
                "differs",
                f"may confirm the turn idle {window_ms} ms after the idle candidate at {stamp(first)} where the log "
                f"recorded: the worker became active again before the next idle candidate at {stamp(then)}; when it "
                "did is not recorded, so whether the turn would have been cut short is not known",
            )
    gap = ms_between(done, mine[-1])
    if gap < window_ms:
        return divergence(
            step,
            "confirm_idle_ms",
            round(gap),
            window_ms,
            "differs",
            f"would wait {window_ms} ms of quiet after the idle candidate at {stamp(mine[-1])} before confirming "
            f"where the log recorded: confirmed after {round(gap)} ms; whether the worker stayed quiet longer "
            "is not recorded",
        )
    return None


def _failure(step: Step, state: GoalState, recorded: GoalState, ctx: _Ctx) -> Divergence | None:
    e = step.event
    assert isinstance(e, r.RunFailed)
    blocked = next((t for _, t in step.tail if isinstance(t, g.GoalBlocked)), None)
    limit = recorded.config.max_failures or DEFAULT_MAX_FAILURES
    immediately = blocked is not None and e.consecutive_failures < limit
    at: datetime | str | None = e.at or step.occurred_at or (blocked.at if blocked else None)
    if not at and e.retry_after:  # a log from before run.failed carried its time: count back the backoff
        at = whole_ms(e.retry_after - timedelta(milliseconds=backoff_ms(e.consecutive_failures)))
    cmd = c.RecordRunFailure(
        goal_id=state.goal_id,
        error_text=e.error,
        source=e.source,
        block_immediately=immediately,
        run_id=None if e.run_id == "unknown" else e.run_id,
        generation=e.generation,
    )
    decided = remake(cmd, state, facts_for(ctx.policy, now_of(step, at)))
    if decided and not e.at and isinstance(decided[0], r.RunFailed | g.GoalCompleted):
        decided[0] = msgspec.structs.replace(decided[0], at=None)
    return compare(step, decided)


def _rejection(step: Step, state: GoalState, recorded: GoalState, ctx: _Ctx) -> Divergence | None:
    e = step.event
    assert isinstance(e, g.GoalCompletionRejected)
    blocked = next((t for _, t in step.tail if isinstance(t, g.GoalBlocked)), None)
    results = tuple(
        c.CheckResult(command=f.command, exit_code=f.exit_code, stdout=f.stdout, stderr=f.stderr)
        for f in e.failures
    )
    if not results:
        return None  # a rejection recorded without its failures (an import): nothing to re-decide it from
    cmd = c.CompleteGoal(
        goal_id=state.goal_id,
        summary="",
        evidence="",
        attempt_id=e.attempt_id,
        check_results=results,
        cwd=e.cwd,
    )
    now = _details_time(e.details) or (blocked.at if blocked else None)
    decided = remake(cmd, state, facts_for(ctx.policy, now_of(step, now)))
    return compare(step, decided)


def _details_time(details: str) -> str | None:
    head = details.partition("\n")[0]
    return head.rpartition(" at ")[2] or None if head.startswith("Rejection #") else None


def _completed(step: Step, state: GoalState, recorded: GoalState, ctx: _Ctx) -> Divergence | None:
    """A completion: accepted (its checks passed, or forced by the owner) and, for a schedule, its next run."""
    e = step.event
    assert isinstance(e, g.GoalCompleted)
    cmd: c.GoalCommand
    if e.forced:
        cmd = c.ForceComplete(goal_id=state.goal_id, summary=e.summary, evidence=e.evidence)
    else:
        cmd = c.CompleteGoal(goal_id=state.goal_id, summary=e.summary, evidence=e.evidence, attempt_id="")
    decided = remake(cmd, state, facts_for(ctx.policy, now_of(step, e.at, step.occurred_at)))
    if decided and not e.at and isinstance(decided[0], r.RunFailed | g.GoalCompleted):
        decided[0] = msgspec.structs.replace(decided[0], at=None)
    return compare(step, decided)


def _budget(step: Step, state: GoalState, recorded: GoalState, ctx: _Ctx) -> Divergence | None:
    e = step.event
    assert isinstance(e, g.GoalBudgetExhausted)
    if not e.worker_aborted:
        return None  # decided with an idle confirmation, checked there
    return compare(
        step, remake(c.EnforceBudget(goal_id=state.goal_id), state, facts_for(ctx.policy, now_of(step)))
    )


def _after_usage(step: Step, state: GoalState, recorded: GoalState, ctx: _Ctx) -> Divergence | None:
    """Under a changed budget: would the usage just accounted exhaust it (the engine then aborts the turn)?"""
    if not isinstance(step.event, g.GoalUsageAccounted) or not (
        {"token_budget", "cost_budget"} & ctx.policy.goal.keys()
    ):
        return None
    decided = remake(c.EnforceBudget(goal_id=state.goal_id), state, facts_for(ctx.policy, now_of(step)))
    if not decided or remake(
        c.EnforceBudget(goal_id=recorded.goal_id), recorded, facts_for(Policy(), now_of(step))
    ):
        return None
    return divergence(
        step,
        "budget",
        None,
        describe(decided),
        "stops_earlier",
        f"would {describe(decided)} and abort the running turn where the log recorded: the goal went on",
    )


def _limit(step: Step, state: GoalState, recorded: GoalState, ctx: _Ctx) -> Divergence | None:
    e = step.event
    assert isinstance(e, i.ProviderLimitObserved)
    tail = [t for _, t in step.tail]
    fell = next((t for t in tail if isinstance(t, r.RunFellBack)), None)
    catalog, unseen = _catalog(tail, state)
    cmd = c.ObserveProviderError(
        goal_id=state.goal_id,
        error=None,
        error_text=(state.last_error or "") if e.marks_blocker else "\0not the blocking error",
        source=e.source,
        expected_model=e.model,
        via=e.via,
        fallback_turn=fell is not None,
        run_id=fell.run_id if fell else None,
        generation=fell.generation if fell else None,
    )
    prepared_at = next(
        (t.at for t in tail if isinstance(t, i.FallbackPrepared | r.RunFellBack) and t.at), None
    )
    facts = facts_for(
        ctx.policy,
        now_of(step, prepared_at),
        model_catalog=catalog,
        can_switch_model=catalog is not None and catalog.switching != "unsupported",
    )
    decided = observe_limit(cmd, state, facts, e)
    if fell is not None and not decided:
        decided = _failed_instead(cmd, state, facts, e)
    chosen = next((d.model for d in decided if isinstance(d, i.FallbackPrepared)), None)
    if chosen in unseen:
        ctx.report.assumptions.append(
            f"{chosen} is taken as usable: the log records no catalog answer for it"
        )
    if not prepared_at:
        decided = [
            msgspec.structs.replace(d, at=None) if isinstance(d, i.FallbackPrepared | r.RunFellBack) else d
            for d in decided
        ]
    return compare(step, decided)


def _failed_instead(
    cmd: c.ObserveProviderError, state: GoalState, facts: c.Facts, e: i.ProviderLimitObserved
) -> list[Event]:
    """What the engine records when a turn's provider limit finds no fallback ready (``sagas.fallback``): the
    run's failure (counted, backed off or blocked), then the observation. The log keeps no error text for a
    turn that fell back, so the failure names the limit's kind."""
    failure = c.RecordRunFailure(
        goal_id=state.goal_id,
        error_text=f"provider {e.kind} limit (the error's own text is not in the log)",
        source=e.source,
        run_id=cmd.run_id,
        generation=cmd.generation,
    )
    failed = remake(failure, state, facts)
    after = state
    for event in failed:
        after = evolve(after, event)
    observed = observe_limit(
        msgspec.structs.replace(cmd, fallback_turn=False, run_id=None, generation=None), after, facts, e
    )
    return [*failed, *observed]


def _catalog(tail: list[Event], state: GoalState) -> tuple[c.ModelCatalog | None, set[str]]:
    """The model catalog the recorded fallback outcome implies; models it says nothing of count as usable."""
    if any(isinstance(t, i.FallbackUnsupported) for t in tail):
        return c.ModelCatalog(capability="unsupported"), set()
    if any(isinstance(t, i.FallbackUnavailable) for t in tail):
        return c.ModelCatalog(capability="unavailable"), set()
    known: dict[str, c.ModelInfo] = {}
    for t in tail:
        if isinstance(t, i.FallbackPrepared | i.FallbackExhausted):
            for m in t.attempted:
                known[m] = c.ModelInfo(usable=False)
        if isinstance(t, i.FallbackPrepared):
            known[t.model] = c.ModelInfo(usable=True)
    unseen = {m for m in state.config.fallback_models if m not in known}
    models = {**{m: c.ModelInfo(usable=True) for m in unseen}, **known}
    return c.ModelCatalog(models=models), unseen


def _control(step: Step, state: GoalState, recorded: GoalState, ctx: _Ctx) -> Divergence | None:
    """An owner control or a switch decision (:mod:`.controls`)."""
    return CHECKS[step.env.type](step, state, ctx.policy)


_CHECKERS: Final[dict[str, _Checker]] = {
    "run.started": _start,
    "run.completed": _confirm,
    "run.failed": _failure,
    "goal.completion_rejected": _rejection,
    "goal.budget_exhausted": _budget,
    "goal.completed": _completed,
    "identity.provider_limit_observed": _limit,
    **dict.fromkeys(CHECKS, _control),
}


_CHECKED: Final = frozenset(_CHECKERS)
