"""docs/reference/loopd.md#s7 parts A (creation), C (worker tools) and D (owner controls) as decider/reducer
tests."""

from __future__ import annotations

import pytest

from loopd_es.clock import parse_rfc3339
from loopd_es.domain import goal_commands as c
from loopd_es.domain.rules import RuleError
from loopd_es.errors import DomainError
from loopd_es.events import goal as g
from loopd_es.events import run as r

from ._domain_harness import OWNER, Goal

# -- A. creation ------------------------------------------------------------------------------------------


def test_s01_defaults_on_creation() -> None:
    goal = Goal()
    goal.facts = goal.facts.__class__(now=goal.facts.now, defaults=c.CreationDefaults(directory="/proj"))
    goal.start()
    st = goal.state
    cfg = st.config
    assert st.status == "active"
    assert (cfg.max_turns, cfg.workspace_write, cfg.checks, cfg.check_cwd) == (
        50,
        True,
        ("bun test",),
        "/proj",
    )
    assert cfg.artifact_dir == "/proj/.opencode/loopd/goals/g1"
    assert cfg.progress_file == "/proj/.opencode/loopd/goals/g1/progress.md"
    assert (st.tokens_used, st.cost_used, st.time_used_seconds) == (0, 0.0, 0.0)
    assert (st.phase, st.run_count, st.budget_turn_count, st.run_generation) == ("running", 1, 1, 1)
    assert st.active_prompt_message_id is not None and st.active_prompt_message_id.startswith("msg_")
    assert goal.types() == ["goal.created", "goal.worker_assigned", "run.started"]
    started = goal.log[-1]
    assert isinstance(started, r.RunStarted) and started.turn_count == 1


@pytest.mark.parametrize(
    ("args", "message", "code"),
    [
        ({"schedule_every_ms": 500}, "scheduleEveryMs must be a number >= 1000", "invalid_schedule"),
        ({"schedule_max_runs": 2}, "scheduleMaxRuns requires scheduleEveryMs", "invalid_schedule"),
        (
            {"schedule_every_ms": 1000, "schedule_max_runs": 1.5},
            "scheduleMaxRuns must be an integer >= 1",
            "invalid_schedule",
        ),
        ({"cost_budget": 0}, "costBudget must be a positive number of dollars", "invalid_cost_budget"),
        ({"cost_budget": -1}, "costBudget must be a positive number of dollars", "invalid_cost_budget"),
        (
            {"cost_budget": float("nan")},
            "costBudget must be a positive number of dollars",
            "invalid_cost_budget",
        ),
        (
            {"owner_session_id": "main"},
            "A valid owner session is required. Run /goal from an active OpenCode session.",
            "invalid_owner_session",
        ),
    ],
)
def test_s02_s03_creation_validation(args: dict[str, object], message: str, code: str) -> None:
    goal = Goal()
    with pytest.raises(RuleError) as info:
        goal.create(**args)
    assert str(info.value) == message and info.value.code == code
    assert goal.log == [] and not goal.state.exists


def test_s04_invalid_model() -> None:
    with pytest.raises(RuleError) as info:
        Goal().create(model="gpt4")
    assert str(info.value).startswith('Invalid model "gpt4". Use "providerID/modelID"')
    assert info.value.code == "invalid_model"


def test_s05_fallback_validation_before_any_side_effect() -> None:
    catalog = c.ModelCatalog(models={"p/new": c.ModelInfo(usable=True)})
    cases = [
        (("bad",), 'Invalid model "bad". Use "providerID/modelID" (e.g. "openai/gpt-5.6-sol").'),
        (
            ("p/missing",),
            'Fallback model "p/missing" is unavailable or not positively known usable. Discover models with loopd_list_models.',
        ),
        (("p/new",) * 17, "At most 16 ordered fallback models are allowed."),
        (("  ",), "Fallback model must be providerID/modelID."),
    ]
    for models, message in cases:
        goal = Goal()
        with pytest.raises(
            DomainError, match="^" + message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")
        ):
            goal.do(
                c.CreateGoal(
                    goal_id="g1", name="n", objective="o", owner_session_id=OWNER, fallback_models=models
                ),
                model_catalog=catalog,
            )
        assert goal.log == []
    goal = Goal()
    goal.do(
        c.CreateGoal(
            goal_id="g1", name="n", objective="o", owner_session_id=OWNER, fallback_models=("p/new", " p/new")
        ),
        model_catalog=catalog,
    )
    assert goal.state.config.fallback_models == ("p/new",)


def test_s06_single_writer() -> None:
    writers = (c.WriterGoal(goal_id="idA", name="A", owner_session_id="o1"),)
    goal = Goal("B")
    with pytest.raises(DomainError) as info:
        goal.do(
            c.CreateGoal(goal_id="B", name="B", objective="o", owner_session_id="o2"), active_writers=writers
        )
    assert str(info.value) == (
        'Workspace-writing goal "A" (idA) is already active (owned by session o1, not this session). Pause, '
        "block, complete, or clear it before activating another workspace-writing goal. Note: "
        "list_background_goals shows only this session's goals; clear/pause it from its owning session."
    )
    assert goal.log == []
    goal.do(
        c.CreateGoal(goal_id="B", name="B", objective="o", owner_session_id="o2", workspace_write=False),
        active_writers=writers,
    )
    assert goal.state.exists and goal.state.status == "active"


def test_s07_worker_creation_failure() -> None:
    goal = Goal()
    goal.create()
    goal.do(c.RecordWorkerFailure(goal_id="g1", detail="boom"))
    st = goal.state
    said = f"boom (worker model {st.config.model or 'the host default'}, agent {st.config.agent or 'the host default'})"
    assert st.status == "blocked" and st.phase == "idle" and st.last_error == said  # names the model (#22.9)
    assert st.blocker is not None and st.blocker.reason == said
    assert st.blocker.needed == (
        "Start the goal again from a valid OpenCode session after correcting the worker creation error."
    )
    assert goal.types()[-1] == "goal.blocked"


def test_s08_first_prompt_delivery_failure() -> None:
    goal = Goal()
    goal.start()
    goal.do(
        c.RecordRunFailure(goal_id="g1", error_text="D", source="prompt-delivery", block_immediately=True)
    )
    st = goal.state
    assert st.status == "blocked" and st.consecutive_failures == 1 and st.active_run_id is None
    assert st.run_deadline is None
    assert st.blocker is not None and st.blocker.reason == "Worker prompt delivery failed: D"
    assert st.blocker.needed == "Retry after the OpenCode worker/session API is available."
    assert goal.types() == [
        "goal.created",
        "goal.worker_assigned",
        "run.started",
        "run.failed",
        "goal.blocked",
    ]
    failed = goal.log[3]
    assert isinstance(failed, r.RunFailed) and failed.consecutive_failures == 1


# -- C. worker tools and evaluation -----------------------------------------------------------------------


def test_s29_rejected_completion_is_a_free_retry() -> None:
    goal = Goal()
    goal.start(checks=("false",))
    goal.apply(g.GoalForceFinishRequested(goal_id="g1", reason="x"))
    for _ in range(4):  # budgetTurnCount 5
        goal.idle()
        goal.turn()
    assert goal.state.budget_turn_count == 5
    events = goal.do(
        c.CompleteGoal(
            goal_id="g1",
            summary="s",
            evidence="e",
            attempt_id="a1",
            check_results=(c.CheckResult(command="false", exit_code=1),),
        )
    )
    rejected = events[0]
    assert isinstance(rejected, g.GoalCompletionRejected)
    assert (rejected.rejection_count, rejected.failed_check_count, rejected.free_retry) == (1, 1, True)
    st = goal.state
    assert st.status == "active" and st.evaluator_rejection_count == 1 and st.free_retry_pending
    assert st.force_finish_requested is False and st.budget_turn_count == 5
    assert st.last_rejection_details is not None and st.last_rejection_details.startswith("Rejection #1 at ")
    goal.idle()
    goal.turn()
    assert goal.state.budget_turn_count == 5 and not goal.state.free_retry_pending
    goal.idle()
    goal.turn()
    assert goal.state.budget_turn_count == 6


def test_s07g7_rejection_limit_blocks() -> None:
    goal = Goal()
    goal.start(checks=("false",))
    fail = (c.CheckResult(command="false", exit_code=1, stderr="bad"),)
    for n in range(3):
        goal.do(
            c.CompleteGoal(goal_id="g1", summary="s", evidence="e", attempt_id=f"a{n}", check_results=fail)
        )
    st = goal.state
    assert st.status == "blocked" and st.evaluator_rejection_count == 3 and not st.free_retry_pending
    assert st.blocker is not None and st.blocker.reason.startswith(
        "Evaluator rejected 3 time(s). Last failure:\n"
    )
    assert st.blocker.needed == "Fix the failing checks and retry the goal."


def test_s31_successful_completion_with_schedule() -> None:
    goal = Goal()
    goal.start(checks=("true",), schedule_every_ms=10000, schedule_max_runs=3)
    goal.do(
        c.CompleteGoal(
            goal_id="g1",
            summary="s",
            evidence="e",
            attempt_id="a",
            check_results=(c.CheckResult(command="true", exit_code=0),),
        )
    )
    st = goal.state
    assert st.status == "complete" and st.completion_evidence is not None
    assert st.run_deadline is None and st.active_run_id is None
    assert st.schedule_run_count == 1 and st.next_run_at == parse_rfc3339("2026-12-02T12:00:10.000Z")
    assert goal.types()[-1] == "goal.completed"


@pytest.mark.parametrize("status", ["paused", "budget_limited"])
def test_s32_worker_tools_on_parked_goal(status: str) -> None:
    goal = Goal()
    goal.start()
    goal.apply(g.GoalStatusChanged(goal_id="g1", from_status="active", to_status=status))  # type: ignore[arg-type]
    with pytest.raises(DomainError, match=r"^No active goal to complete\.$"):
        goal.do(c.CompleteGoal(goal_id="g1", summary="s", evidence="e", attempt_id="a"))
    with pytest.raises(DomainError, match=r"^No active goal to report progress for\.$"):
        goal.do(c.ReportProgress(goal_id="g1", summary="s"))


def test_s32_worker_tools_on_blocked_goal() -> None:
    goal = Goal()
    goal.start()
    goal.do(c.ForceBlock(goal_id="g1"))
    with pytest.raises(DomainError, match=r"^Goal is blocked, not active\. Cannot report progress\.$"):
        goal.do(c.ReportProgress(goal_id="g1", summary="s"))
    with pytest.raises(DomainError, match=r"^Cannot block goal in blocked state\.$"):
        goal.do(c.BlockGoal(goal_id="g1", reason="r", needed="n"))


def test_s33_progress_resets_counters() -> None:
    goal = Goal()
    goal.start()
    goal.do(c.RecordRunFailure(goal_id="g1", error_text="x"))
    goal.turn()
    goal.do(c.RecordRunFailure(goal_id="g1", error_text="x"))
    assert goal.state.consecutive_failures == 2
    goal.do(c.ReportProgress(goal_id="g1", summary="s", next="n"))
    st = goal.state
    assert (st.consecutive_failures, st.no_progress_count, st.progress_during_turn) == (0, 0, True)
    assert st.last_progress is not None and (st.last_progress.summary, st.last_progress.next) == ("s", "n")
    assert goal.types()[-1] == "goal.progress"


# -- D. owner controls ------------------------------------------------------------------------------------


def test_s34_pause() -> None:
    goal = Goal()
    goal.start()
    goal.do(c.PauseGoal(goal_id="g1", caller=OWNER))
    st = goal.state
    assert (st.status, st.phase, st.active_run_id, st.worker_session_id) == ("paused", "idle", None, "W")
    assert goal.do(c.PauseGoal(goal_id="g1")) == []  # already paused: silent no-op
    with pytest.raises(DomainError, match=r"^No matching active goal for this session\.$"):
        goal.do(c.PauseGoal(goal_id="g1", caller="stranger"))


def test_s35_resume_reuses_the_worker_and_keeps_counters() -> None:
    goal = Goal()
    goal.start()
    goal.do(c.RecordRunFailure(goal_id="g1", error_text="x"))
    goal.do(c.PauseGoal(goal_id="g1"))
    events = goal.do(c.ResumeGoal(goal_id="g1", caller=OWNER))
    assert isinstance(events[0], g.GoalResumed) and events[0].from_status == "paused"
    goal.turn()
    st = goal.state
    assert (st.status, st.worker_session_id, st.run_count, st.consecutive_failures) == ("active", "W", 2, 1)


def test_resume_asserts_the_single_writer_rule() -> None:
    goal = Goal()
    goal.start()
    goal.do(c.PauseGoal(goal_id="g1"))
    writers = (c.WriterGoal(goal_id="other", name="O", owner_session_id=OWNER),)
    with pytest.raises(
        DomainError, match='^Workspace-writing goal "O" \\(other\\) is already active\\. Pause'
    ):
        goal.do(c.ResumeGoal(goal_id="g1"), active_writers=writers)


def test_s36_retry_resets() -> None:
    goal = Goal()
    goal.start(checks=("false",), max_evaluator_rejections=5)
    fail = (c.CheckResult(command="false", exit_code=1),)
    goal.do(c.CompleteGoal(goal_id="g1", summary="s", evidence="e", attempt_id="a", check_results=fail))
    goal.do(c.CompleteGoal(goal_id="g1", summary="s", evidence="e", attempt_id="b", check_results=fail))
    goal.apply(g.GoalForceFinishRequested(goal_id="g1", reason="r"))
    for _ in range(3):
        goal.do(c.RecordRunFailure(goal_id="g1", error_text="x"))
    goal.apply(g.GoalBlocked(goal_id="g1", reason="r", needed="n"))
    goal.do(c.RetryGoal(goal_id="g1", caller=OWNER))
    st = goal.state
    assert st.status == "active"
    assert (st.consecutive_failures, st.evaluator_rejection_count, st.free_retry_pending) == (0, 0, False)
    assert st.force_finish_requested is None and st.run_deadline is None
    assert goal.do(c.RetryGoal(goal_id="g1")) == []  # not blocked: silent no-op


def test_s37_nudge_guards() -> None:
    goal = Goal()
    goal.start()
    goal.do(c.PauseGoal(goal_id="g1"))
    with pytest.raises(DomainError, match=r"^Goal is paused; resume or retry it before nudging\.$"):
        goal.do(c.NudgeGoal(goal_id="g1"))
    goal.do(c.ResumeGoal(goal_id="g1"))
    goal.turn()
    goal.do(c.NudgeGoal(goal_id="g1"), worker_status="busy")
    assert (goal.state.phase, goal.state.active_run_id, goal.state.active_prompt_message_id) == (
        "idle",
        None,
        None,
    )
    before = goal.state.budget_turn_count
    goal.turn()
    assert goal.state.budget_turn_count == before + 1
    with pytest.raises(DomainError, match=r"^Goal not found\.$"):
        Goal().do(c.NudgeGoal(goal_id="g1"))


def test_s38_send_input() -> None:
    goal = Goal()
    goal.start()
    goal.do(c.PauseGoal(goal_id="g1"))
    events = goal.do(c.SendInput(goal_id="g1", input_id="i1", text="use pnpm"))
    assert [e.event_type for e in events] == ["goal.input_queued"]
    assert [i.text for i in goal.state.inbox] == ["use pnpm"]
    goal.do(c.ResumeGoal(goal_id="g1"))
    events = goal.do(c.SendInput(goal_id="g1", input_id="i2", text="again"))
    assert [e.event_type for e in events] == ["goal.input_queued", "goal.nudged"]
    goal.turn(kind="bare")
    goal.apply(g.GoalInputDelivered(goal_id="g1", input_ids=("i1", "i2")))
    assert goal.state.inbox == ()
    with pytest.raises(DomainError, match=r"^Nothing to send\.$"):
        goal.do(c.SendInput(goal_id="g1", input_id="i3", text="  "))


def test_inbox_keeps_messages_until_delivered() -> None:
    goal = Goal()
    goal.start()
    goal.do(c.SendInput(goal_id="g1", input_id="i1", text="a"))
    goal.do(c.RecordRunFailure(goal_id="g1", error_text="delivery failed", source="prompt-delivery"))
    assert [i.input_id for i in goal.state.inbox] == ["i1"]  # a failed delivery loses nothing


def test_s39_interactive_flag() -> None:
    goal = Goal()
    goal.start(interactive=True)
    assert goal.state.interactive and goal.state.phase == "running"  # the first turn is still sent
    goal.do(c.SetInteractive(goal_id="g1", interactive=False))
    assert not goal.state.interactive
    assert isinstance(goal.log[-1], g.GoalInteractiveChanged) and goal.log[-1].interactive is False


def test_s40_abort_worker() -> None:
    goal = Goal()
    goal.start()
    goal.do(c.AbortWorker(goal_id="g1"))
    st = goal.state
    assert (st.status, st.run_deadline, st.worker_session_id) == ("active", None, "W")
    assert st.worker_aborted_at is not None


def test_s41_clear_then_nothing_applies() -> None:
    goal = Goal()
    goal.start()
    goal.do(c.ClearGoal(goal_id="g1"))
    assert not goal.state.exists and goal.state.cleared
    goal.apply(r.RunCompleted(goal_id="g1", run_id="x"))
    assert goal.state.anomaly_count == 1 and goal.state.anomalies[-1].reason == "goal was cleared"
    with pytest.raises(DomainError, match=r"^Goal not found\.$"):
        goal.do(c.ClearGoal(goal_id="g1"))


def test_force_complete_and_block() -> None:
    goal = Goal()
    goal.start()
    goal.do(c.ForceComplete(goal_id="g1"))
    assert goal.state.status == "complete"
    assert goal.state.completion_evidence is not None
    assert goal.state.completion_evidence.summary == "Force-completed from dashboard."
    with pytest.raises(DomainError, match=r'^Goal "g" already complete\.$'):
        goal.do(c.ForceComplete(goal_id="g1"))
    goal.do(c.ForceBlock(goal_id="g1"))
    assert goal.state.blocker is not None and goal.state.blocker.reason == "Blocked from dashboard."
    with pytest.raises(DomainError, match=r'^Goal "g" already blocked\.$'):
        goal.do(c.ForceBlock(goal_id="g1"))
