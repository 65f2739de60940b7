"""Events that cannot apply are anomalies, never state: stale run failures (#10.3), a goal re-created after it
was cleared (#10.5)."""

from __future__ import annotations

import msgspec
import pytest

from loopd_es.domain import goal_commands as c
from loopd_es.domain.evolve import evolve
from loopd_es.domain.rules import RuleError
from loopd_es.events import goal as g
from loopd_es.events import identity as i
from loopd_es.events import run as r
from loopd_es.events.envelope import Envelope

from ._domain_harness import OWNER, Goal


def _on_second_run() -> Goal:
    """A goal whose first run (run-1, generation 1) ended and whose second (generation 2) is running."""
    goal = Goal()
    goal.start()
    goal.idle()
    goal.turn()
    assert goal.state.phase == "running" and goal.state.run_generation == 2
    return goal


def test_a_late_failure_of_an_earlier_run_decides_nothing() -> None:
    goal = _on_second_run()
    events = goal.do(c.RecordRunFailure(goal_id="g1", error_text="late", run_id="run-1", generation=1))
    assert events == [] and goal.state.phase == "running" and goal.state.consecutive_failures == 0


def test_a_failure_of_the_current_run_carries_its_id_and_generation() -> None:
    goal = _on_second_run()
    run_id = goal.state.active_run_id
    (failed,) = goal.do(c.RecordRunFailure(goal_id="g1", error_text="now", run_id=run_id, generation=2))
    assert isinstance(failed, r.RunFailed)
    assert (failed.run_id, failed.generation) == (run_id, 2)
    assert goal.state.phase == "waiting_retry" and goal.state.consecutive_failures == 1


@pytest.mark.parametrize(
    "stale",
    [
        r.RunFailed(goal_id="g1", run_id="run-1", error="late", consecutive_failures=1, generation=1),
        r.RunFailed(goal_id="g1", run_id="run-1", error="late", consecutive_failures=1),  # an old log's shape
    ],
    ids=["generation", "run-id"],
)
def test_a_stale_run_failed_folds_to_an_anomaly(stale: r.RunFailed) -> None:
    goal = _on_second_run()
    before = goal.state
    goal.apply(stale)
    after = goal.state
    assert after.phase == "running" and after.active_run_id == before.active_run_id
    assert after.consecutive_failures == 0 and after.last_error is None
    assert after.anomaly_count == 1 and after.anomalies[-1].reason == "stale run"


def test_old_failures_without_a_generation_still_apply() -> None:
    """A log written before ``generation`` existed: the current run's failure, or one outside any run."""
    goal = _on_second_run()
    goal.apply(
        r.RunFailed(goal_id="g1", run_id=goal.state.active_run_id or "", error="e", consecutive_failures=1)
    )
    assert (
        goal.state.phase == "idle" and goal.state.consecutive_failures == 1 and goal.state.anomaly_count == 0
    )
    goal.apply(r.RunFailed(goal_id="g1", run_id="unknown", error="e", consecutive_failures=2))
    assert goal.state.consecutive_failures == 2 and goal.state.anomaly_count == 0


def test_a_stored_old_run_failed_is_read_and_fenced() -> None:
    """The stored JSON of a pre-generation ``run.failed`` (no ``generation`` key) is read and fenced by run id."""
    goal = _on_second_run()
    old = b'{"goal_id":"g1","run_id":"run-1","error":"late","consecutive_failures":1}'
    stored = Envelope(
        position=9,
        stream="goal-g1",
        version=9,
        event_id="e" * 36,
        type="run.failed",
        schema_version=1,
        recorded_at="2026-12-02T12:00:00.000Z",
        causation_id=None,
        correlation_id=None,
        data=msgspec.Raw(old),
    )
    after = evolve(goal.state, stored)
    assert after.phase == "running" and after.anomalies[-1].reason == "stale run"


def test_created_after_cleared_is_an_anomaly_not_a_resurrection() -> None:
    goal = Goal()
    goal.start()
    turns = goal.state.budget_turn_count
    goal.do(c.ClearGoal(goal_id="g1"))
    goal.apply(g.GoalCreated(goal_id="g1", name="again", objective="o", owner_session_id=OWNER))
    st = goal.state
    assert not st.exists and st.cleared and st.name == "g" and st.budget_turn_count == turns
    assert st.anomaly_count == 1 and st.anomalies[-1].type == "goal.created"
    assert st.anomalies[-1].reason == "goal was cleared"


def test_creating_a_cleared_goal_again_is_refused() -> None:
    goal = Goal()
    goal.start()
    goal.do(c.ClearGoal(goal_id="g1"))
    with pytest.raises(RuleError, match="^goal g1 was cleared$"):
        goal.create()


def test_a_stuck_notice_of_an_earlier_run_is_an_anomaly() -> None:
    goal = _on_second_run()
    goal.apply(r.RunStuck(goal_id="g1", run_id="run-1", stuck_seconds=300.0, generation=1))
    assert goal.state.stuck_notified_run_id is None and goal.state.anomalies[-1].reason == "stale run"
    current = goal.state.active_run_id or ""
    goal.apply(r.RunStuck(goal_id="g1", run_id=current, stuck_seconds=300.0, generation=2))
    assert goal.state.stuck_notified_run_id == current and goal.state.anomaly_count == 1


def test_a_switch_deferred_during_another_ones_flight_survives_its_outcome() -> None:
    """#10.2 in the fold: the in-flight switch's ``switch_applied`` clears only pendings older than it."""
    goal = Goal()
    goal.start()
    goal.apply(
        i.IdentitySwitchDeferred(goal_id="g1", switch_id="s0", agent="new")
    )  # older than s1: superseded
    goal.apply(i.IdentitySwitchRequested(goal_id="g1", switch_id="s1", model="p/new", agent="last"))
    goal.apply(i.IdentitySwitchDeferred(goal_id="g1", switch_id="s2", model="p/last"))  # during s1's flight
    assert goal.state.model_pending is not None and goal.state.model_pending.after_switch == "s1"
    goal.apply(
        i.IdentitySwitchApplied(
            goal_id="g1", switch_id="s1", target="identity", to_model="p/new", to_agent="last"
        )
    )
    st = goal.state
    assert (st.config.model, st.config.agent) == ("p/new", "last")
    assert st.model_pending is not None and st.model_pending.model == "p/last"
    assert st.agent_pending is None
