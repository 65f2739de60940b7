"""The engine's records about a goal's turns go through ``decide``: each rule holds there, and a stale command
(a run that moved on, a goal that went away) decides nothing instead of recording against the wrong run."""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import pytest

from loopd_es.clock import parse_rfc3339
from loopd_es.domain import goal_commands as c
from loopd_es.domain.decide import decide
from loopd_es.events import engine as en
from loopd_es.events import goal as g
from loopd_es.events import identity as i
from loopd_es.events import run as r

from ._domain_harness import Goal


def _running() -> tuple[Goal, str, int]:
    goal = Goal()
    goal.start()
    run_id, gen = goal.state.active_run_id, goal.state.run_generation
    assert run_id is not None
    return goal, run_id, gen


def test_every_engine_command_decides_nothing_on_a_missing_goal() -> None:
    goal = Goal()
    commands: list[c.GoalCommand] = [
        c.AssignWorker(goal_id="g1", worker_session_id="W"),
        c.RequestTurn(goal_id="g1", switch_id="s"),
        c.RecordInputDelivered(goal_id="g1", input_ids=("a",)),
        c.QueueEvidence(
            goal_id="g1", input_id="await:x", text="t", at=parse_rfc3339("2026-12-02T12:00:00.000Z")
        ),
        c.WakeForEvidence(goal_id="g1", input_id="await:x"),
        c.StageIdleCandidate(goal_id="g1", run_id="r", generation=1),
        c.RecordConfirmFailure(goal_id="g1", run_id="r", generation=1, reason="worker-active"),
        c.RecoverRun(goal_id="g1", run_id="r", generation=1, quiet_seconds=1.0),
        c.RecordStuck(goal_id="g1", run_id="r", generation=1, stuck_seconds=1.0, watchdog="busy"),
        c.StartCompaction(goal_id="g1"),
        c.CompleteCompaction(goal_id="g1"),
    ]
    for command in commands:
        assert decide(command, goal.state, goal.facts) == [], command


def test_a_worker_is_recorded_with_its_fork_origin() -> None:
    goal = Goal()
    goal.create()
    (event,) = goal.do(
        c.AssignWorker(
            goal_id="g1",
            worker_session_id="W2",
            forked_from_session_id="W1",
            fork_method="primed",
            kept_messages=4,
        )
    )
    assert event == g.GoalWorkerAssigned(
        goal_id="g1",
        worker_session_id="W2",
        forked_from_session_id="W1",
        fork_method="primed",
        kept_messages=4,
    )
    assert goal.state.worker_session_id == "W2"


@pytest.mark.parametrize(
    "command",
    [
        lambda run, gen: c.StageIdleCandidate(goal_id="g1", run_id=run, generation=gen),
        lambda run, gen: c.RecordConfirmFailure(
            goal_id="g1", run_id=run, generation=gen, reason="worker-active"
        ),
        lambda run, gen: c.RecoverRun(goal_id="g1", run_id=run, generation=gen, quiet_seconds=200.0),
        lambda run, gen: c.RecordStuck(
            goal_id="g1", run_id=run, generation=gen, stuck_seconds=9.0, watchdog="busy"
        ),
    ],
)
def test_a_run_record_names_the_running_run_only(command: Callable[[str, int], c.GoalCommand]) -> None:
    goal, run_id, gen = _running()
    assert decide(command("other-run", gen), goal.state, goal.facts) == []
    assert decide(command(run_id, gen + 1), goal.state, goal.facts) == []
    (event,) = decide(command(run_id, gen), goal.state, goal.facts)
    assert msgspec.structs.asdict(event)["run_id"] == run_id
    assert msgspec.structs.asdict(event)["generation"] == gen
    goal.idle()  # the run completed: a late record of it decides nothing
    assert decide(command(run_id, gen), goal.state, goal.facts) == []


def test_a_confirm_failure_is_recorded_once_per_generation_and_a_stuck_run_once() -> None:
    goal, run_id, gen = _running()
    failed = c.RecordConfirmFailure(
        goal_id="g1", run_id=run_id, generation=gen, reason="assistant-incomplete"
    )
    assert [type(e) for e in goal.do(failed)] == [r.RunConfirmFailed]
    assert goal.do(failed) == []
    stuck = c.RecordStuck(
        goal_id="g1", run_id=run_id, generation=gen, stuck_seconds=301.0, watchdog="idle-unconfirmed"
    )
    (event,) = goal.do(stuck)
    assert event == r.RunStuck(
        goal_id="g1", run_id=run_id, stuck_seconds=301.0, watchdog="idle-unconfirmed", generation=gen
    )
    assert goal.do(stuck) == []


def test_the_idle_candidate_carries_the_deciders_time() -> None:
    goal, run_id, gen = _running()
    (event,) = goal.do(c.StageIdleCandidate(goal_id="g1", run_id=run_id, generation=gen))
    assert isinstance(event, r.RunIdleCandidate) and event.at == parse_rfc3339("2026-12-02T12:00:00.000Z")


def test_only_inbox_items_still_waiting_are_delivered() -> None:
    goal, run_id, _ = _running()
    goal.apply(g.GoalInputQueued(goal_id="g1", input_id="a", text="x"))
    delivered = c.RecordInputDelivered(goal_id="g1", input_ids=("a", "gone"), run_id=run_id)
    assert goal.do(delivered) == [g.GoalInputDelivered(goal_id="g1", input_ids=("a",), run_id=run_id)]
    assert goal.state.inbox == ()
    assert goal.do(delivered) == []  # delivered already: nothing twice


def test_await_evidence_is_queued_and_wakes_an_active_goal_while_it_waits() -> None:
    goal, run_id, gen = _running()
    queued = goal.do(
        c.QueueEvidence(
            goal_id="g1",
            input_id="await:f1",
            text="[command c1 exited]",
            at=parse_rfc3339("2026-12-02T12:00:00.000Z"),
        )
    )
    assert queued == [
        g.GoalInputQueued(
            goal_id="g1",
            input_id="await:f1",
            text="[command c1 exited]",
            sender="worker",
            at=parse_rfc3339("2026-12-02T12:00:00.000Z"),
        )
    ]
    wake = c.WakeForEvidence(goal_id="g1", input_id="await:f1")
    assert goal.do(wake) == [g.GoalNudged(goal_id="g1")]
    goal.do(c.PauseGoal(goal_id="g1"))
    assert goal.do(wake) == []  # a paused goal keeps the evidence for its next active turn
    goal.do(c.ResumeGoal(goal_id="g1"))
    goal.apply(g.GoalInputDelivered(goal_id="g1", input_ids=("await:f1",)))
    assert goal.do(wake) == []  # delivered: the wake is done


def test_a_turn_request_waits_for_its_switch_and_a_bare_one_replaces_a_steering_one() -> None:
    goal, _, _ = _running()
    goal.idle()
    request = c.RequestTurn(goal_id="g1", switch_id="sw1")
    assert goal.do(request) == []  # no switch in flight: the caller starts the turn itself
    goal.apply(i.IdentitySwitchRequested(goal_id="g1", switch_id="sw1", model="p/new"))
    assert decide(c.RequestTurn(goal_id="g1", switch_id="sw0"), goal.state, goal.facts) == []
    (steer,) = goal.do(request)
    assert isinstance(steer, g.GoalTurnRequested) and steer.kind == "steer" and steer.switch_id == "sw1"
    assert goal.do(request) == []  # one request waits already
    (bare,) = goal.do(c.RequestTurn(goal_id="g1", switch_id="sw1", kind="bare", force=True))
    assert isinstance(bare, g.GoalTurnRequested) and bare.kind == "bare" and bare.force


def test_compaction_is_started_after_the_run_count_and_completed_with_its_error() -> None:
    goal, _, _ = _running()
    goal.idle()
    (started,) = goal.do(c.StartCompaction(goal_id="g1"))
    assert started == en.CompactionStarted(
        goal_id="g1", run_count=1, at=parse_rfc3339("2026-12-02T12:00:00.000Z")
    )
    assert goal.state.phase == "compacting"
    (done,) = goal.do(c.CompleteCompaction(goal_id="g1", error="interrupted (the engine stopped)"))
    assert done == en.CompactionCompleted(goal_id="g1", error="interrupted (the engine stopped)")
    assert goal.state.phase != "compacting"
