"""Worker tools and owner controls through the engine's operations (docs/reference/loopd.md#s7-c, #s7-d), with
real checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopd_es.domain.rules import RuleError
from loopd_es.engine.core import EngineConfig

from ._engine_harness import Rig, rig

pytestmark = pytest.mark.anyio


async def _worker(r: Rig, gid: str) -> str:
    sid = (await r.state(gid)).worker_session_id
    assert sid is not None
    return sid


async def test_s29_a_rejected_completion_gives_a_free_retry_with_the_verdict(tmp_path: Path) -> None:
    async with rig(tmp_path, config=EngineConfig(confirm_idle_ms=0)) as r:
        gid = await r.create(checks=("false",))
        sid = await _worker(r, gid)
        result = await r.ops.complete(sid, "done", "trust me")
        assert not result.ok and result.status == "active"
        assert result.message == "Evaluator rejected completion. Fix the issues above and try again."
        state = await r.state(gid)
        assert (state.evaluator_rejection_count, state.free_retry_pending, state.budget_turn_count) == (
            1,
            True,
            1,
        )
        await r.host.reply(sid)
        await r.pump()
        await r.advance(0)
        state = await r.state(gid)
        assert state.budget_turn_count == 1 and not state.free_retry_pending  # the retry turn was free
        prompt = (await r.prompts(sid))[-1]
        assert "## HOST VERDICT: COMPLETION REJECTED" in prompt and "Rejection #1" in prompt


async def test_the_rejection_limit_blocks_and_tells_the_owner(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        gid = await r.create(checks=("echo out; echo err >&2; exit 3",), max_evaluator_rejections=2)
        sid = await _worker(r, gid)
        await r.ops.complete(sid, "a", "b")
        result = await r.ops.complete(sid, "a", "b")
        assert result.message == "Evaluator rejection limit reached. Goal blocked; owner retry required."
        failed = result.data["failed_checks"][0]
        assert (failed["exit_code"], failed["stdout"], failed["stderr"]) == (3, "out\n", "err\n")
        state = await r.state(gid)
        assert state.status == "blocked" and state.blocker is not None
        assert state.blocker.reason.startswith("Evaluator rejected 2 time(s). Last failure:")
        notes = [n.text for n in await r.host.notifications()]
        assert len(notes) == 1 and notes[0].startswith('Loop goal "g" blocked: Evaluator rejected 2 time(s).')


async def test_s31_checks_that_pass_complete_the_goal_in_the_check_directory(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "ok").write_text("")
    async with rig(tmp_path) as r:
        gid = await r.create(checks=("test -f ok",), check_cwd=str(work))
        sid = await _worker(r, gid)
        result = await r.ops.complete(sid, "built it", "tests pass")
        assert result.ok and result.status == "complete"
        state = await r.state(gid)
        assert state.status == "complete" and state.phase == "idle"
        notes = [n.text for n in await r.host.notifications()]
        assert notes == [
            f'Loop goal "g" completed: built it. Evidence: tests pass. Artifacts: {state.config.artifact_dir}.'
        ]


async def test_s32_worker_tools_on_parked_goals_answer_with_the_reference_messages(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        gid = await r.create()
        sid = await _worker(r, gid)
        await r.ops.pause(gid)
        with pytest.raises(RuleError, match="No active goal to complete."):
            await r.ops.complete(sid, "s", "e")
        with pytest.raises(RuleError, match="No active goal to report progress for."):
            await r.ops.report_progress(sid, "s")
        await r.ops.resume(gid)
        await r.ops.force_block(gid)
        with pytest.raises(RuleError, match="Goal is blocked, not active. Cannot report progress."):
            await r.ops.report_progress(sid, "s")
        with pytest.raises(RuleError, match="Cannot block goal in blocked state."):
            await r.ops.block(sid, "r", "n")


async def test_s33_progress_resets_failures_and_shows_in_the_next_prompt(tmp_path: Path) -> None:
    async with rig(tmp_path, config=EngineConfig(confirm_idle_ms=0)) as r:
        gid = await r.create()
        sid = await _worker(r, gid)
        await r.ops.report_progress(sid, "s", "n")
        await r.host.reply(sid)
        await r.pump()
        await r.advance(0)
        prompt = (await r.prompts(sid))[-1]
        assert "] s\n  → next: n" in prompt


async def test_s37_nudge_guards_and_reprompts_a_busy_worker(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        gid = await r.create()
        sid = await _worker(r, gid)
        await r.ops.pause(gid)
        with pytest.raises(RuleError, match="Goal is paused; resume or retry it before nudging."):
            await r.ops.nudge(gid)
        await r.ops.resume(gid)
        await r.host.go_busy(sid)
        result = await r.ops.nudge(gid)
        assert result.message == 'Re-prompted worker for "g".'
        assert "This is continuation run" in (await r.prompts(sid))[-1]


async def test_s38_send_input_queues_or_sends_a_bare_turn(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        gid = await r.create()
        sid = await _worker(r, gid)
        await r.ops.pause(gid)
        result = await r.ops.send(gid, "use pnpm")
        assert result.message == 'Queued for "g" (goal is paused; delivers on the next active turn).'
        await r.ops.resume(gid)  # the resumed turn carries the queued words
        assert "- [user] use pnpm" in (await r.prompts(sid))[-1]
        assert (await r.state(gid)).inbox == ()
        before = (await r.state(gid)).budget_turn_count
        result = await r.ops.send(gid, "use pnpm")
        assert result.message == 'Sent to "g" as its own turn.'
        assert (await r.prompts(sid))[-1] == "[user] use pnpm"
        state = await r.state(gid)
        assert state.inbox == () and state.budget_turn_count == before + 1


async def test_s36_retry_resets_the_counters(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        gid = await r.create(checks=("false",), max_evaluator_rejections=1)
        sid = await _worker(r, gid)
        await r.ops.complete(sid, "a", "b")
        assert (await r.state(gid)).status == "blocked"
        result = await r.ops.resume(gid)
        state = await r.state(gid)
        assert result.status == "active" and state.evaluator_rejection_count == 0 and state.phase == "running"


async def test_s40_abort_worker_keeps_status_and_session(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        gid = await r.create()
        sid = await _worker(r, gid)
        result = await r.ops.abort_worker(gid)
        assert result.message.endswith(" Engine continues the same session next turn.")
        state = await r.state(gid)
        assert state.status == "active" and state.phase == "idle" and state.worker_session_id == sid
        assert [c.op for c in await r.host.journal("abort")] == ["abort"]


async def test_force_complete_and_force_block_say_when_already_done(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        gid = await r.create()
        await r.ops.force_complete(gid)
        with pytest.raises(RuleError, match='Goal "g" already complete.'):
            await r.ops.force_complete(gid)
        await r.ops.force_block(gid)
        with pytest.raises(RuleError, match='Goal "g" already blocked.'):
            await r.ops.force_block(gid)


async def test_retry_switch_and_inspect_through_the_python_api(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        gid = await r.create(model="openai/gpt-5", agent="build")
        await r.ops.force_block(gid)
        result = await r.ops.retry(gid)
        assert result.status == "active" and (await r.ops.inspect(gid)).run_count == 2
        sid = await _worker(r, gid)
        await r.host.go_busy(sid)
        result = await r.ops.switch_identity(gid, agent="plan")
        assert result.data["outcome"] == "deferred"
        assert (await r.ops.inspect(gid)).agent_pending is not None


async def test_a_notice_whose_cause_was_recorded_without_an_engine_is_delivered_once_at_start(
    tmp_path: Path,
) -> None:
    from loopd_es.app.service import Ctx
    from loopd_es.domain import goal_commands as c
    from loopd_es.engine.core import Engine

    async with rig(tmp_path) as r:
        gid = await r.create()
        other = await r.create("h", workspace_write=False)
        # recorded by a process that crashed before asking for the notice
        await r.ops.service.execute(
            c.BlockGoal(goal_id=gid, reason="no network", needed="connect me"), Ctx.new()
        )
        await r.ops.force_block(other)  # the owner's own block is not told back to them
        assert await r.host.notifications() == []
        for _ in range(2):
            engine = Engine(r.store, r.host, r.clock, EngineConfig(), directory=str(tmp_path))
            await engine.start()
        notes = [n.text for n in await r.host.notifications()]
        assert notes == ['Loop goal "g" blocked: no network. Needed: connect me.']
