"""The turn loop on a fake clock (docs/reference/loopd.md#s7-b): two-stage idle, limits, budgets, retries,
compaction,
interactive goals, usage accounting and the steering prompt."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from loopd_es.clock import stamp
from loopd_es.engine.core import EngineConfig
from loopd_es.host.events import SessionIdle, SessionStatusChanged
from loopd_es.host.sim_script import HostScript
from loopd_es.sagas.crashpoints import CRASH_TRACE_ENV

from ._engine_harness import rig

pytestmark = pytest.mark.anyio


async def test_s09_two_idles_confirm_and_the_next_turn_is_a_continuation(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        gid, sid = await r.started()
        await r.host.reply(sid)  # answers and goes idle: status idle + session.idle
        await r.pump()
        state = await r.state(gid)
        assert state.run_count == 1 and state.idle_candidate_generation == 1  # staged, not yet confirmed
        await r.advance(2.0)  # the confirm timer polls the idle worker: the second signal
        state = await r.state(gid)
        assert (state.run_count, state.budget_turn_count, state.run_generation) == (2, 2, 2)
        prompts = await r.prompts(sid)
        assert len(prompts) == 2 and prompts[1].startswith("This is continuation run 2")
        assert "## GOAL (user-provided data)" in prompts[1] and "## INSTRUCTIONS" in prompts[1]
        assert (await r.types(gid)).count("run.completed") == 1


async def test_a_second_idle_inside_the_quiet_period_does_not_confirm(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        gid, sid = await r.started()
        await r.host.reply(sid)
        await r.pump()
        r.clock.advance(1.0)
        await r.host.go_idle(sid)
        await r.pump()
        assert len(await r.prompts(sid)) == 1
        await r.advance(1.0)
        assert len(await r.prompts(sid)) == 2


async def test_s11_an_incomplete_assistant_blocks_finalisation_once_per_generation(tmp_path: Path) -> None:
    async with rig(tmp_path, config=EngineConfig(confirm_idle_ms=0)) as r:
        gid, sid = await r.started()
        await r.host.reply(sid, complete=False)
        for _ in range(3):
            await r.host.go_idle(sid)
            await r.pump()
        state = await r.state(gid)
        assert state.phase == "running" and len(await r.prompts(sid)) == 1
        assert (await r.types(gid)).count("run.confirm_failed") == 1


async def test_s12_a_newer_user_prompt_is_outside_the_window(tmp_path: Path) -> None:
    async with rig(tmp_path, config=EngineConfig(confirm_idle_ms=0)) as r:
        gid, sid = await r.started()
        await r.host.user_message(sid, "msg_someone_else")
        for _ in range(3):
            await r.host.go_idle(sid)
            await r.pump()
        assert len(await r.prompts(sid)) == 1
        events = [e async for e in r.store.read_stream(f"goal-{gid}") if e.type == "run.confirm_failed"]
        assert len(events) == 1 and events[0].data_dict()["reason"] == "prompt-outside-window"


async def test_s13_the_completion_event_anchors_the_turn_even_when_the_prompt_scrolled_away(
    tmp_path: Path,
) -> None:
    async with rig(tmp_path, config=EngineConfig(confirm_idle_ms=0)) as r:
        gid, sid = await r.started()
        await r.host.reply(sid, idle=False)  # message.updated with the completion: the anchor
        await r.pump()
        await r.host.user_message(sid, "msg_later")  # the prompt is no longer the latest user message
        await r.host.go_idle(sid)
        await r.pump()
        await r.advance(0)
        assert len(await r.prompts(sid)) == 2


async def test_s15_an_open_tool_call_vetoes_idle_until_its_ttl(tmp_path: Path) -> None:
    async with rig(tmp_path, config=EngineConfig(confirm_idle_ms=0, maintenance_ms=30_000)) as r:
        gid, sid = await r.started()
        await r.host.tool_call(sid, "c1")
        await r.host.reply(sid)
        await r.pump()
        await r.advance(0)
        assert len(await r.prompts(sid)) == 1 and r.engine.tracker.live(gid).tools
        r.engine.next_maintenance = r.clock.now()
        await r.advance(31)  # maintenance: the call is older than 30 s without activity, cleared
        assert not r.engine.tracker.live(gid).tools


async def test_s16_a_session_error_waits_with_backoff_then_the_timer_retries(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        gid, sid = await r.started()
        await r.host.fail(sid, {"message": "test error"})
        await r.pump()
        state = await r.state(gid)
        assert (state.phase, state.consecutive_failures) == ("waiting_retry", 1)
        assert state.retry_after is not None and stamp(state.retry_after).startswith("2026-12-02T12:00:02")
        await r.advance(1.9)
        assert len(await r.prompts(sid)) == 1
        await r.advance(0.1)
        assert len(await r.prompts(sid)) == 2 and (await r.state(gid)).phase == "running"


async def test_failures_back_off_exponentially_and_block_at_max_failures(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        gid, sid = await r.started(max_failures=3)
        waits = []
        for _ in range(2):
            await r.host.fail(sid, {"statusCode": 500})
            await r.pump()
            state = await r.state(gid)
            assert state.retry_after is not None
            waits.append(stamp(state.retry_after)[17:19])
            await r.advance(30)
        assert waits == ["02", "34"]  # 2 s after the failure at 12:00:00, 4 s after the one at 12:00:30
        await r.host.fail(sid, {"statusCode": 500})
        await r.pump()
        state = await r.state(gid)
        assert state.status == "blocked" and state.blocker is not None
        assert state.blocker.reason.startswith("Failed 3 times.")
        notes = await r.host.notifications()
        assert len(notes) == 1
        assert notes[0].text == 'Loop goal "g" blocked after 3 failures. Last error: {"statusCode":500}.'


async def test_s18_max_turns_forces_one_final_turn_then_blocks_and_tells_the_owner(tmp_path: Path) -> None:
    async with rig(tmp_path, config=EngineConfig(confirm_idle_ms=0)) as r:
        gid, sid = await r.started(max_turns=1)
        await r.host.reply(sid)
        await r.pump()
        await r.advance(0)
        state = await r.state(gid)
        assert state.force_finish_requested is True and state.status == "active"
        prompts = await r.prompts(sid)
        assert len(prompts) == 2 and "## FINAL REPORT REQUIRED — STOPPING SOON" in prompts[1]
        await r.host.reply(sid)
        await r.pump()
        await r.advance(0)
        state = await r.state(gid)
        assert state.status == "blocked" and state.blocker is not None
        assert state.blocker.reason == "Reached max turns (1) (force-finish ignored)"
        assert len(await r.prompts(sid)) == 2
        notes = [n.text for n in await r.host.notifications()]
        assert notes == [
            'Loop goal "g" stopped: Reached max turns (1) (child did not wrap up). Status: blocked. '
            "Last progress: none."
        ]


async def test_s19_token_budget_at_idle_stops_without_a_notice(tmp_path: Path) -> None:
    script = HostScript()
    async with rig(tmp_path, script, EngineConfig(confirm_idle_ms=0)) as r:
        gid, sid = await r.started(token_budget=100)
        await r.host.reply(sid, input=100, output=50)
        await r.pump()
        await r.advance(0)
        state = await r.state(gid)
        assert state.status == "budget_limited" and state.tokens_used == 150
        assert len(await r.prompts(sid)) == 1 and await r.host.notifications() == []


async def test_s21_usage_is_accounted_once_per_message(tmp_path: Path) -> None:
    async with rig(tmp_path, config=EngineConfig(confirm_idle_ms=0)) as r:
        gid, sid = await r.started()
        await r.host.reply(
            sid, input=10, output=5, cost=0.01
        )  # message.updated, then the transcript at confirm
        await r.pump()
        await r.advance(0)
        state = await r.state(gid)
        assert (state.tokens_used, round(state.cost_used, 6)) == (15, 0.01)
        assert (await r.types(gid)).count("goal.usage_accounted") == 1


async def test_cost_budget_mid_turn_aborts_the_worker_and_tells_the_owner(tmp_path: Path) -> None:
    async with rig(tmp_path, config=EngineConfig(confirm_idle_ms=60_000)) as r:
        gid, sid = await r.started(cost_budget=0.5)
        await r.host.reply(sid, cost=0.75, idle=False)
        await r.pump()
        r.engine.next_maintenance = r.clock.now()
        await r.advance(0)
        state = await r.state(gid)
        assert state.status == "budget_limited"
        assert [c.op for c in await r.host.journal("abort")] == ["abort"]
        notes = [n.text for n in await r.host.notifications()]
        assert notes == [
            'Loop goal "g" stopped: Cost budget exhausted ($0.7500/$0.5). Worker aborted, status: budget_limited. '
            "Resume with resume_goal to continue spending."
        ]


async def test_s22_compaction_cadence_and_no_immediate_prompt(tmp_path: Path) -> None:
    async with rig(tmp_path, config=EngineConfig(confirm_idle_ms=0)) as r:
        gid, sid = await r.started(compact_every=2)
        for _ in range(2):
            await r.host.reply(sid)
            await r.pump()
            await r.advance(0)
        types = await r.types(gid)
        assert "compaction.started" in types and "compaction.completed" in types
        assert (await r.state(gid)).phase == "idle"
        assert [c.op for c in await r.host.journal("compact")] == ["compact"]
        assert len(await r.prompts(sid)) == 2  # no prompt right after compaction
        r.engine.next_maintenance = r.clock.now()
        await r.advance(0)  # maintenance polls the idle worker and continues
        assert len(await r.prompts(sid)) == 3


async def test_s39_an_interactive_goal_never_gets_an_engine_turn(tmp_path: Path) -> None:
    async with rig(tmp_path, config=EngineConfig(confirm_idle_ms=0)) as r:
        gid, sid = await r.started(interactive=True)
        assert len(await r.prompts(sid)) == 1  # the first turn is still sent
        await r.host.reply(sid)  # status idle *and* session.idle: both are idle signals
        await r.pump()
        await r.host.go_idle(sid)
        await r.pump()
        r.engine.next_maintenance = r.clock.now()
        await r.advance(200)
        assert len(await r.prompts(sid)) == 1
        result = await r.ops.set_interactive(gid, False)
        assert result.message == 'Goal "g" is back on auto: the engine resumes idle recovery and retries.'


async def test_s23_unknown_status_is_counted_and_the_owner_told_once(tmp_path: Path) -> None:
    async with rig(tmp_path, config=EngineConfig(unknown_threshold=2)) as r:
        gid, sid = await r.started()
        await r.host.set_status(sid, "unknown")
        for _ in range(4):
            r.engine.next_maintenance = r.clock.now()
            await r.advance(30)
        assert r.engine.tracker.live(gid).unknown_count == 2
        notes = [n.text for n in await r.host.notifications()]
        assert len(notes) == 1 and "worker is unreachable after 2 status checks" in notes[0]
        await r.host.set_status(sid, "busy")
        r.engine.next_maintenance = r.clock.now()
        await r.advance(30)
        assert r.engine.tracker.live(gid).unknown_count == 0


async def test_s27_a_wedged_running_phase_is_recovered_and_continued(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        gid, sid = await r.started()
        r.clock.advance(181)
        r.engine.next_maintenance = r.clock.now()
        await r.advance(0)
        events = [e async for e in r.store.read_stream(f"goal-{gid}") if e.type == "run.recovered"]
        assert len(events) == 1 and events[0].data_dict()["quiet_seconds"] >= 180
        assert len(await r.prompts(sid)) == 2


@pytest.mark.parametrize("how", ["restart", "adoption"])
async def test_a_turn_that_ended_before_its_new_engine_listened_is_confirmed_not_recovered(
    tmp_path: Path, how: str
) -> None:
    """The worker answered and went idle while no engine heard it (the holder was killed), and the run began
    longer ago than S27's 3 minutes: the engine taking the turn over confirms it, with no extra turn. (A
    stress run once saw an adopter record run.recovered and prompt a fourth time.)"""
    from loopd_es.engine.core import Engine

    async with rig(tmp_path) as r:
        gid, sid = await r.started()
        await r.host.reply(sid)  # answered and idle: events nobody hands to an engine
        r.seen.clear()
        r.clock.advance(181)
        fresh = Engine(r.store, r.host, r.clock, EngineConfig(), directory=str(tmp_path))
        await fresh.start()
        if how == "adoption":  # what a shared member does with a goal it claims from a dead holder
            await fresh.adopt(gid, resend=True)
        fresh.next_maintenance = r.clock.now()
        await fresh.run_due()  # the idle worker is the first signal: staged
        r.clock.advance(2.0)
        await fresh.run_due()  # the candidate's timer: the second
        types = await r.types(gid)
        assert "run.recovered" not in types and types.count("run.completed") == 1, types
        assert len(await r.prompts(sid)) == 2
        r.engine = fresh  # the rig's own engine never ran; the checks at the end read the log


async def test_s28_busy_stuck_is_reported_once_per_run_and_never_reprompts(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        gid, sid = await r.started()
        await r.host.go_busy(sid)
        await r.pump()
        for _ in range(2):
            r.clock.advance(601)
            r.engine.next_maintenance = r.clock.now()
            await r.advance(0)
        assert (await r.types(gid)).count("run.stuck") == 1
        notes = [n.text for n in await r.host.notifications()]
        assert len(notes) == 1 and "worker may be stuck: no activity for 10m while reporting busy" in notes[0]
        assert len(await r.prompts(sid)) == 1


async def test_a_busy_turn_taken_over_is_stuck_only_after_the_new_engine_saw_it_quiet(tmp_path: Path) -> None:
    """S28's 10 minutes count from the takeover: the new engine heard none of the activity before it."""
    from loopd_es.engine.core import Engine

    async with rig(tmp_path) as r:
        gid, sid = await r.started()
        await r.host.go_busy(sid)
        r.seen.clear()
        r.clock.advance(601)  # the run started more than 10 minutes ago, under the engine that stopped
        fresh = Engine(r.store, r.host, r.clock, EngineConfig(), directory=str(tmp_path))
        await fresh.start()
        fresh.next_maintenance = r.clock.now()
        await fresh.run_due()
        assert "run.stuck" not in await r.types(gid)
        r.clock.advance(601)
        fresh.next_maintenance = r.clock.now()
        await fresh.run_due()
        assert (await r.types(gid)).count("run.stuck") == 1
        assert len(await r.prompts(sid)) == 1
        r.engine = fresh


async def test_s26_blocked_goals_are_not_restarted(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        gid, sid = await r.started()
        await r.ops.force_block(gid)
        for _ in range(3):
            r.engine.next_maintenance = r.clock.now()
            await r.advance(30)
        assert (await r.state(gid)).status == "blocked" and len(await r.prompts(sid)) == 1


async def test_idle_but_unconfirmable_for_five_minutes_is_reported_once(tmp_path: Path) -> None:
    async with rig(tmp_path, config=EngineConfig(confirm_idle_ms=0)) as r:
        gid, sid = await r.started()
        await r.host.reply(sid, complete=False)
        await r.host.go_idle(sid)
        await r.pump()  # stage, then the confirmation fails: the answer is incomplete
        assert (await r.types(gid)).count("run.confirm_failed") == 1
        for _ in range(4):  # activity keeps the run from idle recovery, not from this watchdog
            r.clock.advance(100)
            await r.host.go_busy(sid)
            await r.host.set_status(sid, "idle")
            await r.pump()
            r.engine.next_maintenance = r.clock.now()
            await r.advance(0)
        events = [e async for e in r.store.read_stream(f"goal-{gid}") if e.type == "run.stuck"]
        assert len(events) == 1 and events[0].data_dict()["watchdog"] == "idle-unconfirmed"
        notes = [n.text for n in await r.host.notifications()]
        assert (
            len(notes) == 1 and "worker is idle but its turn will not confirm (unconfirmed for 6m" in notes[0]
        )  # 400 s after the failure
        assert "run.recovered" not in await r.types(gid)


async def test_s14_only_messages_of_the_running_prompt_count_as_its_activity(tmp_path: Path) -> None:
    from loopd_es.host.events import MessageUpdated, TranscriptMessage

    async with rig(tmp_path) as r:
        gid = await r.create()
        state = await r.state(gid)
        sid, prompt = state.worker_session_id, state.active_prompt_message_id
        assert sid is not None and prompt is not None

        def answer(message_id: str, parent: str, completed: bool = False) -> MessageUpdated:
            message = TranscriptMessage(
                message_id=message_id, role="assistant", parent_id=parent, completed=completed
            )
            return MessageUpdated(session_id=sid, message=message)

        assert await r.engine.on_host_event(answer("assistant-current", prompt)) is True
        assert r.engine.tracker.live(gid).assistant_id == "assistant-current"
        assert await r.engine.on_host_event(answer("assistant-old", "older-prompt")) is False
        assert r.engine.tracker.live(gid).assistant_id == "assistant-current"
        assert await r.engine.on_host_event(answer("assistant-current", prompt, completed=True)) is True
        before = r.engine.tracker.live(gid).last_activity
        r.clock.advance(5)
        assert await r.engine.on_host_event(answer("assistant-current", prompt)) is False  # trailing part
        assert r.engine.tracker.live(gid).last_activity == before


async def test_s34_a_paused_goal_ignores_idle_and_s35_resume_reuses_the_worker(tmp_path: Path) -> None:
    async with rig(tmp_path, config=EngineConfig(confirm_idle_ms=0)) as r:
        gid, sid = await r.started()
        result = await r.ops.pause(gid)
        assert result.message == 'Goal "g" paused. Resume with resume_goal.'
        state = await r.state(gid)
        assert (state.status, state.phase, state.active_run_id) == ("paused", "idle", None)
        assert [c.op for c in await r.host.journal("abort")] == ["abort"]
        await r.host.go_idle(sid)
        from loopd_es.host.events import SessionIdle

        assert await r.engine.on_host_event(SessionIdle(session_id=sid)) is False
        result = await r.ops.resume(gid)
        state = await r.state(gid)
        assert state.status == "active" and state.worker_session_id == sid and state.run_count == 2
        assert len(await r.prompts(sid)) == 2


async def test_s41_a_cleared_goal_is_forgotten_by_the_engine(tmp_path: Path) -> None:
    async with rig(tmp_path, config=EngineConfig(confirm_idle_ms=0)) as r:
        gid, sid = await r.started()
        result = await r.ops.clear(gid)
        assert result.message == 'Goal "g" cleared and removed.'
        await r.engine.catch_up()
        assert r.engine.tracker.goal_of_session(sid) is None
        await r.host.reply(sid)
        await r.pump()
        r.engine.next_maintenance = r.clock.now()
        await r.advance(30)
        assert len(await r.prompts(sid)) == 1


async def test_a_restarted_engine_resumes_the_current_retry_deadline_not_an_old_one(tmp_path: Path) -> None:
    from loopd_es.engine.core import Engine

    async with rig(tmp_path) as r:
        gid, sid = await r.started()
        await r.host.fail(sid, {"statusCode": 500})
        await r.pump()
        await r.advance(2)  # the first retry (2 s)
        await r.host.fail(sid, {"statusCode": 500})
        await r.pump()  # the second failure waits 4 s
        fresh = Engine(r.store, r.host, r.clock, EngineConfig(), directory=str(tmp_path))
        await fresh.start()  # replays both failures' deadlines
        fresh.next_maintenance = None
        r.clock.advance(3.9)
        await fresh.run_due()
        assert len(await r.prompts(sid)) == 2
        r.clock.advance(0.1)
        await fresh.run_due()
        assert len(await r.prompts(sid)) == 3


async def test_a_restaged_candidate_is_confirmed_by_its_own_timer(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        gid, sid = await r.started()
        await r.host.reply(sid, idle=False)
        await r.host.go_idle(sid)
        await r.pump()  # staged at 0 s
        r.clock.advance(1.5)
        await r.host.tool_call(sid, "c1")
        await r.host.tool_call(sid, "c1", done=True)  # activity at 1.5 s
        await r.host.go_idle(sid)
        await r.pump()  # inside the quiet period: kept
        await r.advance(0.5)  # 2 s: the timer's poll finds activity after the candidate: staged again at 2 s
        assert len(await r.prompts(sid)) == 1
        assert (await r.types(gid)).count("run.idle_candidate") == 2
        await r.advance(1.9)
        assert len(await r.prompts(sid)) == 1
        await r.advance(0.1)  # 4 s: the new candidate's own timer confirms, without any new host event
        assert len(await r.prompts(sid)) == 2


async def test_a_refused_pending_switch_blocks_the_goal_and_the_engine_goes_on(tmp_path: Path) -> None:
    from loopd_es.host.sim_script import FailureRule

    async with rig(tmp_path, config=EngineConfig(confirm_idle_ms=0)) as r:
        gid, sid = await r.started(model="openai/gpt-5", agent="build")
        await r.host.go_busy(sid)
        await r.ops.switch_identity(gid, agent="plan")  # deferred: the worker is busy
        await r.host.inject(FailureRule(op="switch_agent", error="rejected"))
        await r.host.reply(sid)
        await r.pump()
        await r.advance(0)  # the confirmation's next turn applies the pending switch first: refused
        state = await r.state(gid)
        assert state.status == "blocked" and state.blocker is not None
        assert state.blocker.reason == "Pending agent switch was not accepted."
        assert len(await r.prompts(sid)) == 1


async def test_compaction_applies_a_pending_switch_first(tmp_path: Path) -> None:
    async with rig(tmp_path, config=EngineConfig(confirm_idle_ms=0)) as r:
        gid, sid = await r.started(model="openai/gpt-5", agent="build", compact_every=1)
        await r.host.go_busy(sid)
        await r.ops.switch_identity(gid, agent="plan")  # deferred while busy
        await r.host.reply(sid)
        await r.pump()
        await r.advance(0)  # run 1 confirmed: compaction is due (every 1 run)
        ops = [c.op for c in await r.host.journal("switch_agent", "compact")]
        assert ops == ["switch_agent", "compact"]
        state = await r.state(gid)
        assert state.config.agent == "plan" and state.agent_pending is None and state.phase == "idle"


async def test_parts_of_the_running_answer_are_activity_and_a_v2_success_anchors_the_turn(
    tmp_path: Path,
) -> None:
    from loopd_es.host.events import ExecutionSucceeded, MessagePartUpdated, MessageUpdated, TranscriptMessage

    async with rig(tmp_path, config=EngineConfig(confirm_idle_ms=0)) as r:
        gid = await r.create()
        state = await r.state(gid)
        sid, prompt = state.worker_session_id, state.active_prompt_message_id
        assert sid is not None and prompt is not None
        answer = TranscriptMessage(message_id="a1", role="assistant", parent_id=prompt)
        assert await r.engine.on_host_event(MessageUpdated(session_id=sid, message=answer))
        r.clock.advance(1)
        assert await r.engine.on_host_event(MessagePartUpdated(session_id=sid, message_id="a1")) is True
        assert r.engine.tracker.live(gid).last_activity == r.clock.now()
        assert await r.engine.on_host_event(MessagePartUpdated(session_id=sid, message_id="other")) is False
        # v2: the execution succeeded, though the transcript never shows a completed answer
        assert await r.engine.on_host_event(ExecutionSucceeded(session_id=sid)) is True
        await r.host.go_idle(sid)
        await r.pump()
        assert len(await r.prompts(sid)) == 2


async def test_a_compaction_cut_by_a_crash_is_closed_and_the_goal_goes_on(tmp_path: Path) -> None:
    from loopd_es.events.catalogue import new_event
    from loopd_es.events.engine import CompactionStarted

    async with rig(tmp_path, config=EngineConfig(confirm_idle_ms=0)) as r:
        gid, sid = await r.started(compact_every=1)
        await r.host.reply(sid)
        await r.pump()
        state = await r.state(gid)
        await r.store.append(
            f"goal-{gid}", [new_event(CompactionStarted(goal_id=gid, run_count=1))], state.version
        )
        assert (await r.state(gid)).phase == "compacting"  # and then the engine died
        for _ in range(2):
            r.engine.next_maintenance = r.clock.now()
            await r.advance(30)
        events = [e async for e in r.store.read_stream(f"goal-{gid}") if e.type == "compaction.completed"]
        assert [bool(e.data_dict().get("error")) for e in events] == [False, True]  # the real one, the repair
        assert len(await r.prompts(sid)) == 2


async def test_an_interactive_goal_still_has_its_budget_enforced(tmp_path: Path) -> None:
    async with rig(tmp_path, config=EngineConfig(confirm_idle_ms=60_000)) as r:
        gid, sid = await r.started(interactive=True, cost_budget=0.5)
        await r.host.reply(sid, cost=0.75, idle=False)
        await r.pump()
        r.engine.next_maintenance = r.clock.now()
        await r.advance(0)
        assert (await r.state(gid)).status == "budget_limited"
        assert len(await r.prompts(sid)) == 1


async def test_each_maintenance_pass_calls_the_due_schedules_hook_with_the_engine_time(
    tmp_path: Path,
) -> None:
    from datetime import datetime

    async with rig(tmp_path) as r:
        seen: list[datetime] = []

        async def due(now: datetime) -> int:
            seen.append(now)
            return 0

        r.engine.due_schedules = due
        for _ in range(2):
            r.engine.next_maintenance = r.clock.now()
            await r.advance(30)
        assert seen == [r.clock.now() - timedelta(seconds=30), r.clock.now()]


async def test_the_stuck_notice_names_the_status_the_worker_reported(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        gid, sid = await r.started()
        await r.host.go_busy(sid, "retry")
        await r.pump()
        r.clock.advance(601)
        r.engine.next_maintenance = r.clock.now()
        await r.advance(0)
        notes = [n.text for n in await r.host.notifications()]
        assert (
            len(notes) == 1
            and "no activity for 10m while reporting retry, lease expired. The goal" in notes[0]
        )


async def test_activity_in_the_candidates_own_millisecond_does_not_restart_the_quiet_period(
    tmp_path: Path,
) -> None:
    """OpenCode sends a busy status just before its idle pair; the candidate's time is recorded to the
    millisecond, so that busy (handled a fraction of a millisecond before the candidate was staged) must not
    read as activity after it, which would stage again and cost a whole second quiet period."""
    async with rig(tmp_path, config=EngineConfig(confirm_idle_ms=0)) as r:
        gid, sid = await r.started()
        await r.host.reply(sid, idle=False)
        await r.pump()
        r.clock.advance(0.0004)  # inside a millisecond: the busy and the candidate share it
        for event in (
            SessionStatusChanged(session_id=sid, status="busy"),
            SessionStatusChanged(session_id=sid, status="idle"),
            SessionIdle(session_id=sid),
        ):
            await r.engine.on_host_event(event)
        assert (await r.types(gid)).count("run.idle_candidate") == 1
        assert len(await r.prompts(sid)) == 2


async def test_activity_a_millisecond_after_the_candidate_still_restarts_the_quiet_period(
    tmp_path: Path,
) -> None:
    async with rig(tmp_path, config=EngineConfig(confirm_idle_ms=0)) as r:
        gid, sid = await r.started()
        await r.host.reply(sid, idle=False)
        await r.pump()
        await r.engine.on_host_event(SessionStatusChanged(session_id=sid, status="idle"))
        r.clock.advance(0.001)
        await r.engine.on_host_event(SessionStatusChanged(session_id=sid, status="busy"))
        await r.engine.on_host_event(SessionIdle(session_id=sid))
        assert (await r.types(gid)).count("run.idle_candidate") == 2
        assert len(await r.prompts(sid)) == 1


async def test_a_status_failure_at_the_confirmation_records_it_and_the_turn_goes_the_ordinary_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker status a plain next turn needs fails to come (a host answers ``unknown`` then: the port's
    rule): the confirmation is recorded on its own and the next turn is started the ordinary way,
    which asks again."""
    from loopd_es.host.sim_script import FailureRule

    async with rig(tmp_path) as r:
        gid, sid = await r.started()
        await r.host.reply(sid)
        await r.pump()  # staged: the confirm timer polls the status, the chain asks it next
        asked = (await r.host.snapshot()).counters.get(f"session_status@{sid}", 0)
        await r.host.inject(
            FailureRule(op="session_status", session=sid, on_call=asked + 2, error="unavailable")
        )
        monkeypatch.setenv(CRASH_TRACE_ENV, str(tmp_path / "trace"))
        await r.advance(2.0)
        monkeypatch.delenv(CRASH_TRACE_ENV)
        appends = [
            line.split(" ")[-1]
            for line in (tmp_path / "trace").read_text().splitlines()
            if " before " in line
        ]
        assert appends[:2] == ["run.completed", "run.started"]  # recorded at once, then the ordinary way
        types = await r.types(gid)
        assert types[-2:] == ["run.completed", "run.started"] and len(await r.prompts(sid)) == 2
        statuses = [c.outcome for c in await r.host.journal("session_status")]
        assert "error:unavailable" in statuses
