"""docs/reference/loopd.md#s7 parts E (identity switching) and F (provider limits and fallback), plus
docs/reference/loopd.md#s3-13 limits."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from loopd_es.clock import parse_rfc3339
from loopd_es.domain import goal_commands as c
from loopd_es.domain.provider_limit import classify
from loopd_es.errors import DomainError
from loopd_es.events import goal as g
from loopd_es.events import identity as i

from ._domain_harness import OWNER, Goal


def _switch_goal(**create: Any) -> Goal:
    """docs/reference/loopd.md#s7-e common setup: interactive goal, agent "old", model "p/old", not a writer,
    idle."""
    goal = Goal()
    goal.start(interactive=True, agent="old", model="p/old", workspace_write=False, **create)
    goal.idle()
    return goal


def _switch(goal: Goal, switch_id: str = "s1", **args: Any) -> list[Any]:
    facts = args.pop("facts", {})
    return goal.do(
        c.SwitchIdentity(goal_id="g1", switch_id=switch_id, caller=args.pop("caller", OWNER), **args), **facts
    )


def _host(goal: Goal, switch_id: str = "s1", **results: Any) -> list[Any]:
    return goal.do(c.RecordSwitchOutcome(goal_id="g1", switch_id=switch_id, **results))


# -- E ----------------------------------------------------------------------------------------------------


def test_s43_a_field_is_required() -> None:
    goal = _switch_goal()
    with pytest.raises(DomainError, match=r"^At least one of model or agent is required\.$"):
        _switch(goal)


def test_s44_combined_applied_changes_only_identity() -> None:
    goal = _switch_goal()
    goal.apply(
        g.GoalUsageAccounted(
            goal_id="g1", message_ids=("m",), token_delta=123, cost_delta=0.25, time_delta_seconds=42
        )
    )
    before = goal.state
    events = _switch(goal, model="p/new", agent="new")
    assert [e.event_type for e in events] == ["identity.switch_requested"]
    events = _host(goal, model_result="applied", agent_result="applied")
    applied = events[0]
    assert isinstance(applied, i.IdentitySwitchApplied) and applied.outcome == "applied"
    after = goal.state
    assert (after.config.model, after.config.agent) == ("p/new", "new")
    assert after.model_last is not None and after.model_last.from_ == "p/old"
    for name in (
        "worker_session_id",
        "tokens_used",
        "cost_used",
        "run_count",
        "budget_turn_count",
        "inbox",
        "status",
        "phase",
        "run_generation",
    ):
        assert getattr(after, name) == getattr(before, name), name


def test_s46_combined_deferred_then_applied_at_the_next_idle_turn() -> None:
    goal = _switch_goal()
    goal.turn()  # a running lease
    events = _switch(goal, model="p/new", agent="new")
    assert [e.event_type for e in events] == ["identity.switch_deferred"]
    assert goal.state.pending_identity is not None and goal.state.config.model == "p/old"
    goal.idle()
    events = goal.do(c.ApplyPendingSwitch(goal_id="g1", switch_id="s2"))
    assert isinstance(events[0], i.IdentitySwitchRequested) and events[0].pending
    _host(goal, "s2", model_result="applied", agent_result="applied")
    st = goal.state
    assert (st.config.model, st.config.agent, st.pending_identity) == ("p/new", "new", None)


def test_single_field_request_fills_the_pending_pair() -> None:
    goal = _switch_goal()
    goal.turn()
    _switch(goal, model="p/new", agent="new")
    _switch(goal, "s2", agent="last")
    pair = goal.state.pending_identity
    assert pair is not None and (pair.model, pair.agent) == ("p/new", "last")
    assert goal.state.model_pending is None and goal.state.agent_pending is None


def test_s48_prevalidation_order() -> None:
    goal = _switch_goal()
    with pytest.raises(DomainError, match="unavailable"):
        _switch(goal, model="p/new", agent="missing")
    with pytest.raises(DomainError, match="unavailable"):
        _switch(goal, model="p/missing", agent="new")
    with pytest.raises(DomainError, match=r"^Goal not found or not owned by this session\.$"):
        _switch(goal, model="p/new", caller="stranger")
    assert goal.log[-1].event_type == "run.completed"  # nothing recorded


def test_s49_unsupported_hosts() -> None:
    goal = _switch_goal()
    events = _switch(goal, model="p/new", agent="new", facts={"agent_catalog": None})
    assert [e.event_type for e in events] == ["identity.switch_unsupported"]
    events = _switch(
        goal, "s2", model="p/new", facts={"model_catalog": c.ModelCatalog(capability="unsupported")}
    )
    assert [e.event_type for e in events] == ["identity.switch_unsupported"]
    assert goal.state.config.model == "p/old" and goal.state.switch_in_flight is None


def test_s51_next_prompt_hosts() -> None:
    goal = _switch_goal()
    _switch(goal, model="p/new", agent="new")
    applied = _host(goal, model_result="next-prompt", agent_result="next-prompt")[0]
    assert isinstance(applied, i.IdentitySwitchApplied) and applied.outcome == "next-prompt"
    assert goal.state.config.model == "p/new"
    assert goal.state.model_last is not None and goal.state.model_last.outcome == "next-prompt"


def test_s52_explicit_resume_only_for_blocked() -> None:
    goal = _switch_goal()
    goal.do(c.ForceBlock(goal_id="g1", reason="manual"))
    _switch(goal, model="p/new", agent="new")
    _host(goal, model_result="applied", agent_result="applied")
    assert goal.state.status == "blocked"
    _switch(goal, "s2", model="p/old", agent="old", resume=True)
    events = _host(goal, "s2", model_result="applied", agent_result="applied")
    assert [e.event_type for e in events] == ["identity.switch_applied", "goal.resumed"]
    resumed = goal.state
    assert resumed.status == "active" and resumed.blocker is None
    with pytest.raises(DomainError, match=r"^resume is only valid for a blocked goal\.$"):
        _switch(goal, "s3", agent="new", resume=True)
    with pytest.raises(DomainError, match=r"^resume is only valid for a provider-limit-blocked goal\.$"):
        _switch(goal, "s4", model="p/new", resume=True)


def test_s55_single_field_switches_never_wake() -> None:
    goal = _switch_goal()
    _switch(goal, model="p/new")
    _host(goal, model_result="applied")
    assert goal.state.phase == "idle" and goal.state.run_count == 1
    goal.do(c.PauseGoal(goal_id="g1"))
    _switch(goal, "s2", model="p/last")
    _host(goal, "s2", model_result="applied")
    assert goal.state.status == "paused" and goal.state.config.model == "p/last"
    events = _switch(goal, "s3", agent="new", facts={"worker_status": "busy"})
    assert isinstance(events[0], i.IdentitySwitchDeferred)
    assert goal.state.agent_pending is not None and goal.state.agent_pending.agent == "new"
    assert goal.state.config.agent == "old"


def test_s56_rejected_pending_switch_blocks_once() -> None:
    goal = _switch_goal()
    goal.turn()
    _switch(goal, model="p/new")
    goal.idle()
    goal.do(c.ApplyPendingSwitch(goal_id="g1", switch_id="s2"))
    events = _host(goal, "s2", model_result="rejected")
    assert [e.event_type for e in events] == ["identity.switch_failed", "goal.blocked"]
    st = goal.state
    assert st.status == "blocked" and st.config.model == "p/old" and st.model_pending is None
    assert st.model_last_failure is not None and st.model_last_failure.reason == "host-rejected"
    assert st.blocker is not None and st.blocker.reason == "Pending model switch was not accepted."
    assert goal.do(c.ApplyPendingSwitch(goal_id="g1", switch_id="s3")) == []


def test_s58_pending_switch_is_applied_before_compaction() -> None:
    goal = _switch_goal()
    goal.turn()
    _switch(goal, model="p/new")
    goal.idle()
    requested = goal.do(c.ApplyPendingSwitch(goal_id="g1", switch_id="s2"))[0]
    assert isinstance(requested, i.IdentitySwitchRequested) and requested.model == "p/new"


def test_rollback_is_recorded() -> None:
    goal = _switch_goal()
    _switch(goal, model="p/new", agent="new")
    events = _host(goal, model_result="applied", agent_result="rejected", rolled_back=False)
    assert [e.event_type for e in events] == ["identity.switch_failed", "identity.rollback_failed"]
    assert goal.state.config.model == "p/old"


def test_completed_goal_never_switches() -> None:
    goal = _switch_goal()
    goal.do(c.ForceComplete(goal_id="g1"))
    with pytest.raises(DomainError, match=r"^Cannot switch a completed goal\.$"):
        _switch(goal, model="p/new")


# -- F ----------------------------------------------------------------------------------------------------

NOW = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)


def test_s59_classification_table() -> None:
    limit = classify(
        {
            "data": {
                "statusCode": 429,
                "message": "secret diagnostic",
                "responseHeaders": {"authorization": "SECRET", "retry-after": "60"},
            }
        },
        "session-error",
        NOW,
        "p/m",
    )
    assert limit is not None and (limit.kind, limit.status_code, limit.model) == ("rate-limit", 429, "p/m")
    assert limit.retry_at == parse_rfc3339("2026-12-02T12:01:00.000Z")
    import msgspec

    text = msgspec.json.encode(limit).decode()
    assert "SECRET" not in text and "diagnostic" not in text
    assert classify({"code": "insufficient_quota"}, "session-error", NOW).kind == "quota"  # type: ignore[union-attr]
    assert classify({"message": "Rate limit exceeded"}, "session-error", NOW).kind == "rate-limit"  # type: ignore[union-attr]
    for error in [
        "network rate limit",
        "authentication quota exceeded",
        "maximum context length exceeded",
        "cost budget limit",
        "maxTurns reached",
        "paused",
        "quota information unknown",
        "rate limit information unknown",
        "ECONNRESET",
        "request timeout",
        "Invalid API key",
        {"statusCode": 401, "message": "quota exceeded"},
        {"statusCode": 403, "message": "rate limited"},
    ]:
        err = error if isinstance(error, dict) else {"message": error}
        assert classify(err, "session-error", NOW) is None, error
    garbage = classify(
        {"statusCode": 429, "responseHeaders": {"retry-after": "garbage-token"}}, "session-error", NOW
    )
    assert garbage is not None and garbage.retry_at is None
    dated = classify({"statusCode": 429, "retryAfter": "Wed, 07 Oct 2026 12:00:00 GMT"}, "session-error", NOW)
    assert dated is not None and dated.retry_at == parse_rfc3339("2026-10-07T12:00:00.000Z")
    wrapped = classify(
        {"message": "wrapper says rate limited", "cause": {"statusCode": 500}}, "session-error", NOW
    )
    assert wrapped is None  # a wrapper with a cause is classified by its cause only


def _quota(goal: Goal, source: Any, text: str = "quota delivery failure") -> list[Any]:
    return goal.do(
        c.ObserveProviderError(
            goal_id="g1",
            error={"message": text, "cause": {"statusCode": 429}},
            error_text=text,
            source=source,
        )
    )


def test_s62_prompt_delivery_quota_prepares_a_fallback() -> None:
    goal = _switch_goal(fallback_models=("p/new", "p/last"))
    goal.turn()
    goal.do(c.RecordRunFailure(goal_id="g1", error_text="quota delivery failure", source="prompt-delivery"))
    events = _quota(goal, "prompt-delivery")
    assert [e.event_type for e in events] == [
        "identity.provider_limit_observed",
        "identity.fallback_prepared",
    ]
    st = goal.state
    assert st.last_provider_limit is not None and st.last_provider_limit.source == "prompt-delivery"
    assert st.model_pending is not None and (st.model_pending.model, st.model_pending.reason) == (
        "p/new",
        "quota",
    )
    assert st.phase == "waiting_retry"
    # a duplicate observation keeps the pending one and does not consume the next alternative
    events = _quota(goal, "prompt-delivery")
    assert isinstance(events[1], i.FallbackPrepared) and events[1].reused
    assert goal.state.model_fallback is not None and goal.state.model_fallback.attempted == ("p/old", "p/new")


def test_s63_session_error_on_interactive_goal() -> None:
    goal = _switch_goal(fallback_models=("p/new",))
    goal.turn()
    goal.do(c.RecordRunFailure(goal_id="g1", error_text="rate limited"))
    goal.do(
        c.ObserveProviderError(
            goal_id="g1",
            error={"data": {"statusCode": 429, "message": "rate limited"}},
            error_text="rate limited",
            source="session-error",
            expected_model="p/old",
        )
    )
    st = goal.state
    assert st.last_provider_limit is not None and st.last_provider_limit.source == "session-error"
    assert st.model_pending is not None and st.model_pending.model == "p/new"
    assert st.phase == "waiting_retry" and st.config.model == "p/old"


def test_fallback_never_retries_a_model_and_exhausts() -> None:
    goal = _switch_goal(fallback_models=("p/new",))
    _quota(goal, "session-error")
    goal.do(c.ApplyPendingSwitch(goal_id="g1", switch_id="s9"))
    _host(goal, "s9", model_result="applied")
    assert goal.state.config.model == "p/new" and goal.state.model_last is not None
    assert goal.state.model_last.reason == "quota"
    events = _quota(goal, "session-error")
    assert isinstance(events[-1], i.FallbackExhausted) and events[-1].attempted == ("p/old", "p/new")


def test_stale_observation_and_paused_goal_are_not_eligible() -> None:
    goal = _switch_goal(fallback_models=("p/new",))
    events = goal.do(
        c.ObserveProviderError(
            goal_id="g1",
            error={"statusCode": 429},
            error_text="x",
            source="session-error",
            expected_model="p/replaced",
        )
    )
    assert [e.event_type for e in events] == ["identity.provider_limit_observed"]
    goal.do(c.PauseGoal(goal_id="g1"))
    assert [e.event_type for e in _quota(goal, "session-error")] == ["identity.provider_limit_observed"]


def test_provider_limit_marks_the_blocker_and_extends_the_backoff() -> None:
    goal = _switch_goal(max_failures=1)
    goal.turn()
    goal.do(c.RecordRunFailure(goal_id="g1", error_text="quota delivery failure"))
    _quota(goal, "session-error")
    assert goal.state.blocker is not None and goal.state.blocker.kind == "provider-limit"
    goal2 = _switch_goal()
    goal2.turn()
    goal2.do(c.RecordRunFailure(goal_id="g1", error_text="x"))
    before = goal2.state.retry_after
    goal2.do(
        c.ObserveProviderError(
            goal_id="g1", error={"statusCode": 429, "retryAfter": 600}, error_text="x", source="session-error"
        )
    )
    assert before is not None and goal2.state.retry_after is not None and goal2.state.retry_after > before


# -- limits (docs/reference/loopd.md#s3-13) and failures (S16, S18, S19, S21)
# -------------------------------------------------------


def test_s16_session_error_below_the_limit_backs_off() -> None:
    goal = Goal()
    goal.start()
    goal.do(c.RecordRunFailure(goal_id="g1", error_text="test error"))
    st = goal.state
    assert (st.consecutive_failures, st.last_error, st.phase) == (1, "test error", "waiting_retry")
    assert st.retry_after == parse_rfc3339("2026-12-02T12:00:02.000Z")


def test_session_error_at_the_limit_blocks() -> None:
    goal = Goal()
    goal.start(max_failures=2)
    goal.do(c.RecordRunFailure(goal_id="g1", error_text="e"))
    goal.turn()
    goal.do(c.RecordRunFailure(goal_id="g1", error_text="e"))
    assert goal.state.status == "blocked"
    assert goal.state.blocker is not None and goal.state.blocker.reason == "Failed 2 times. Last error: e"


def test_s18_max_turns_force_finish_then_block() -> None:
    goal = Goal()
    goal.start(max_turns=1)
    goal.idle()
    assert goal.state.force_finish_requested is True and goal.state.status == "active"
    goal.turn(kind="force_finish")
    goal.idle()
    st = goal.state
    assert st.status == "blocked" and st.force_finish_requested is None
    assert st.blocker is not None and st.blocker.reason == "Reached max turns (1) (force-finish ignored)"


def test_s19_token_budget_at_idle() -> None:
    goal = Goal()
    goal.start(token_budget=100)
    goal.apply(g.GoalUsageAccounted(goal_id="g1", message_ids=("m1",), token_delta=150))
    goal.idle()
    assert goal.state.status == "budget_limited"
    assert isinstance(goal.log[-1], g.GoalBudgetExhausted)
    assert goal.log[-1].reason == "Token budget exhausted (150/100)"


def test_maintenance_budget_prefers_cost() -> None:
    goal = Goal()
    goal.start(token_budget=100, cost_budget=0.5)
    goal.apply(g.GoalUsageAccounted(goal_id="g1", message_ids=("m1",), token_delta=150, cost_delta=0.75))
    events = goal.do(c.EnforceBudget(goal_id="g1"))
    assert isinstance(events[0], g.GoalBudgetExhausted) and events[0].worker_aborted
    assert events[0].reason == "Cost budget exhausted ($0.7500/$0.5)"
    assert goal.state.status == "budget_limited" and goal.state.active_run_id is None


def test_s21_usage_accounting_is_idempotent_by_message_id() -> None:
    goal = Goal()
    goal.start()
    msgs = (
        c.AssistantMessage(message_id="m1", input=10, output=5, cost=0.01, duration_ms=2000),
        c.AssistantMessage(message_id="u1", role="user", input=99),
        c.AssistantMessage(message_id="m2", completed=False, input=99),
    )
    goal.do(c.AccountUsage(goal_id="g1", messages=msgs))
    assert (goal.state.tokens_used, goal.state.cost_used, goal.state.time_used_seconds) == (15, 0.01, 2.0)
    assert goal.do(c.AccountUsage(goal_id="g1", messages=msgs)) == []
    # replaying the same accounting event twice (a duplicate in the log) does not double count
    goal.apply(goal.log[-1])
    assert goal.state.tokens_used == 15 and goal.state.anomaly_count == 1


def test_stale_idle_confirmation_is_a_no_op() -> None:
    goal = Goal()
    goal.start()
    old = (goal.state.active_run_id, goal.state.run_generation)
    goal.idle()
    goal.turn()
    assert goal.do(c.ConfirmIdle(goal_id="g1", run_id=old[0] or "", generation=old[1])) == []
    assert goal.state.phase == "running"
