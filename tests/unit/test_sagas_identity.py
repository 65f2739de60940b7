"""docs/reference/loopd.md#s7-e against the identity-switch saga and the simulated host, plus compensation and
causality."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopd_es.app.crashpoints import Crash, arm
from loopd_es.app.goals import SwitchFailedError
from loopd_es.app.service import Ctx
from loopd_es.domain.rules import RuleError
from loopd_es.domain.streams import goal_stream
from loopd_es.host.sim_script import FailureRule, HostScript
from loopd_es.sagas.identity_switch import ROLLBACK_FAILED

from ._saga_harness import SCRIPT, world

pytestmark = pytest.mark.anyio


async def test_s43_a_field_is_required(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        gid = await w.create()
        with pytest.raises(RuleError, match="At least one of model or agent is required."):
            await w.goals.switch_identity(gid, Ctx.new())
        assert await w.switch_calls() == []


async def test_s44_combined_applied_model_first_and_nothing_else_changes(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        gid = await w.create()
        before = await w.state(gid)
        report = await w.goals.switch_identity(gid, Ctx.new(), model="p/new", agent="new")
        assert (report.outcome, report.model, report.agent) == ("applied", "p/new", "new")
        assert report.message() == "Identity switched to p/new / new on the same worker/session."
        assert await w.switch_calls() == ["model:p/new", "agent:new"]
        after = await w.state(gid)
        assert (after.config.model, after.config.agent) == ("p/new", "new")
        assert after.worker_session_id == before.worker_session_id
        assert (after.run_count, after.budget_turn_count, after.phase) == (before.run_count, 1, before.phase)
        assert len(await w.prompts(after.worker_session_id or "")) == 1
        # one recorded switch for both halves: no replay can show a half-switched identity
        assert (await w.types(gid)).count("identity.switch_applied") == 1
        live = await w.host.session_identity(after.worker_session_id or "")
        assert (live.model, live.agent) == ("p/new", "new")


async def test_s46_deferred_while_running_then_applied_at_the_idle_turn_after_restart(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        gid = await w.create(interactive=False, idle=False)  # the first turn's lease is valid
        report = await w.goals.switch_identity(gid, Ctx.new(), model="p/new", agent="new")
        assert report.outcome == "deferred"
        assert await w.switch_calls() == []
        state = await w.state(gid)
        assert state.pending_identity is not None and state.pending_identity.model == "p/new"
        assert state.config.model == "p/old"
        restarted = w.fresh()
        await w.replied(gid)
        turn = await restarted.idle(gid, Ctx.new())
        assert turn.result == "started" and [r.outcome for r in turn.switches] == ["applied"]
        state = await restarted.service.load(gid)
        assert state.pending_identity is None
        last = (await w.prompts(state.worker_session_id or ""))[-1]
        assert (last.model, last.agent) == ("p/new", "new")


async def test_later_single_field_request_updates_one_half_of_the_pending_pair(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        gid = await w.create(interactive=False, idle=False)
        await w.goals.switch_identity(gid, Ctx.new(), model="p/new", agent="new")
        await w.goals.switch_identity(gid, Ctx.new(), agent="last")
        state = await w.state(gid)
        assert state.pending_identity is not None
        assert (state.pending_identity.model, state.pending_identity.agent) == ("p/new", "last")


async def test_s48_prevalidation_order_and_no_host_calls(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        gid = await w.create()
        with pytest.raises(RuleError, match="Agent is unavailable"):
            await w.goals.switch_identity(gid, Ctx.new(), model="p/new", agent="missing")
        with pytest.raises(RuleError, match='Model "[^"]*" is unavailable or not positively known usable'):
            await w.goals.switch_identity(gid, Ctx.new(), model="p/missing", agent="new")
        with pytest.raises(RuleError, match='Invalid model "nope"'):
            await w.goals.switch_identity(gid, Ctx.new(), model="nope")
        assert await w.switch_calls() == []


async def test_s49_unsupported_host_records_nothing_else(tmp_path: Path) -> None:
    script = HostScript(models=SCRIPT.models, agents=SCRIPT.agents, agent_capability="unsupported")
    async with world(tmp_path, script) as w:
        gid = await w.create()
        before = await w.state(gid)
        report = await w.goals.switch_identity(gid, Ctx.new(), model="p/new", agent="new")
        assert report.outcome == "unsupported" and not report.ok
        assert "unsupported on this host" in report.message()
        after = await w.state(gid)
        assert after.config == before.config and await w.switch_calls() == []


async def test_s51_next_prompt_host_reports_deferred_but_the_next_prompt_carries_it(tmp_path: Path) -> None:
    script = HostScript(
        models=SCRIPT.models,
        agents=SCRIPT.agents,
        model_switching="next-prompt",
        agent_switching="next-prompt",
    )
    async with world(tmp_path, script) as w:
        gid = await w.create(interactive=False)  # idle: run confirmed and the next turn started
        await w.replied(gid)
        await w.goals.idle(gid, Ctx.new())
        w.clock.advance(600)  # the running lease expired
        await w.replied(gid)  # and the worker is idle again
        report = await w.goals.switch_identity(gid, Ctx.new(), model="p/new", agent="new")
        assert report.outcome == "next-prompt"
        assert report.message().startswith("Identity switch deferred")
        state = await w.state(gid)
        assert state.model_last is not None and state.model_last.outcome == "next-prompt"
        await w.goals.continue_turn(gid, Ctx.new(), explicit=True)
        last = (await w.prompts(state.worker_session_id or ""))[-1]
        assert (last.model, last.agent) == ("p/new", "new")


async def test_s52_resume_only_for_blocked_and_counters_kept(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        gid = await w.create()
        with pytest.raises(RuleError, match="resume is only valid for a blocked goal."):
            await w.goals.switch_identity(gid, Ctx.new(), model="p/new", agent="new", resume=True)
        with pytest.raises(RuleError, match="resume is only valid for a provider-limit-blocked goal."):
            await w.goals.switch_identity(gid, Ctx.new(), model="p/new", resume=True)
        from loopd_es.domain import goal_commands as c

        await w.service.execute(c.ForceBlock(goal_id=gid), Ctx.new())
        session = (await w.state(gid)).worker_session_id or ""
        await w.goals.switch_identity(gid, Ctx.new(), model="p/new", agent="new")
        assert (await w.state(gid)).status == "blocked" and len(await w.prompts(session)) == 1
        report = await w.goals.switch_identity(gid, Ctx.new(), model="p/old", agent="old", resume=True)
        assert report.resumed
        state = await w.state(gid)
        assert state.status == "active" and len(await w.prompts(session)) == 2


async def test_s55_single_field_switches_never_wake_or_unpause(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        gid = await w.create()
        session = (await w.state(gid)).worker_session_id or ""
        assert (await w.goals.switch_identity(gid, Ctx.new(), model="p/new")).outcome == "applied"
        await w.goals.pause(gid, Ctx.new())
        assert (await w.goals.switch_identity(gid, Ctx.new(), model="p/last")).outcome == "applied"
        state = await w.state(gid)
        assert state.status == "paused" and state.config.model == "p/last"
        assert len(await w.prompts(session)) == 1
        await w.goals.resume(gid, Ctx.new())  # explicit: prompts once
        await w.replied(gid)
        await w.goals.idle(gid, Ctx.new())
        await w.host.set_status(session, "busy")
        report = await w.goals.switch_identity(gid, Ctx.new(), agent="new")
        state = await w.state(gid)
        assert (
            report.outcome == "deferred" and state.agent_pending is not None and state.config.agent == "old"
        )
        await w.host.set_status(session, "idle")
        await w.goals.continue_turn(gid, Ctx.new(), explicit=True)
        assert (await w.prompts(session))[-1].agent == "new"


async def test_s56_rejected_pending_blocks_once_and_stores_no_secret(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        gid = await w.create(interactive=False, idle=False)
        await w.goals.switch_identity(gid, Ctx.new(), model="p/new")
        await w.host.inject(FailureRule(op="switch_model", error="rejected", detail="SECRET-TOKEN sk-123"))
        with pytest.raises(SwitchFailedError, match="Pending model switch was not accepted; goal blocked"):
            await w.replied(gid)
            await w.goals.idle(gid, Ctx.new())
        turn = await w.goals.idle(gid, Ctx.new())  # blocked now: a silent no-op
        assert turn.result == "not-active"
        state = await w.state(gid)
        assert state.status == "blocked" and state.config.model == "p/old"
        assert state.blocker is not None and state.blocker.reason == "Pending model switch was not accepted."
        assert state.model_last_failure is not None and state.model_last_failure.reason == "host-rejected"
        assert len(await w.host.journal("switch_model")) == 1
        assert all(b"SECRET" not in bytes(e.data) for e in await w.events())


async def test_s58_compaction_applies_the_pending_switch_first(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        gid = await w.create(interactive=False, idle=False)
        await w.goals.switch_identity(gid, Ctx.new(), model="p/new")
        w.clock.advance(600)
        await w.replied(gid)
        await w.goals.compact(gid, Ctx.new())
        calls = await w.host.journal("compact")
        assert [c.arg for c in calls] == ["p/new"]
        assert len(await w.prompts((await w.state(gid)).worker_session_id or "")) == 1


async def test_failed_second_half_is_compensated_agent_then_model(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        gid = await w.create()
        await w.host.inject(FailureRule(op="switch_agent", error="rejected", on_call=1))
        report = await w.goals.switch_identity(gid, Ctx.new(), model="p/new", agent="new")
        assert report.outcome == "rolled-back" and report.message().startswith("Switch rejected:")
        assert await w.switch_calls() == ["model:p/new", "agent:new", "model:p/old"]
        state = await w.state(gid)
        assert (state.config.model, state.config.agent) == ("p/old", "old")
        assert "identity.switch_rolled_back" in await w.types(gid)
        live = await w.host.session_identity(state.worker_session_id or "")
        assert (live.model, live.agent) == ("p/old", "old")


async def test_failed_compensation_is_recorded_and_reported(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        gid = await w.create()
        await w.host.inject(FailureRule(op="switch_agent", error="rejected", on_call=1))
        await w.host.inject(FailureRule(op="switch_model", error="unavailable", on_call=2))
        await w.host.inject(FailureRule(op="session_identity", error="unavailable", on_call=1))
        with pytest.raises(Exception) as info:  # the timeout's outcome cannot be read: saga stays open
            await w.goals.switch_identity(gid, Ctx.new(), model="p/new", agent="new")
        assert "unreachable" in str(info.value)
        reports = await w.goals.recover()  # the host answers again: the compensation landed? no -> failed
        assert [r.outcome for r in reports] == ["rollback-failed"]
        assert reports[0].message() == ROLLBACK_FAILED
        assert "identity.rollback_failed" in await w.types(gid)


async def test_every_event_carries_causation_and_correlation(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        gid = await w.create()
        ctx = Ctx.new()
        await w.goals.switch_identity(gid, ctx, model="p/new", agent="new")
        events = await w.events()
        assert all(e.causation_id and e.correlation_id for e in events)
        flow = [e for e in events if e.correlation_id == ctx.correlation_id]
        by_id = {e.event_id: e for e in events}
        requested = next(e for e in flow if e.type == "identity.switch_requested")
        assert requested.causation_id == ctx.correlation_id
        applied = next(e for e in flow if e.type == "identity.switch_applied")
        assert by_id[applied.causation_id or ""].type == "identity.switch_requested"
        assert {e.stream for e in flow} == {goal_stream(gid), f"switch-{requested.data_dict()['switch_id']}"}


@pytest.mark.parametrize("crash_at", range(1, 19))  # a combined switch passes 18 crash points
async def test_crash_at_any_point_of_a_combined_switch_recovers_to_the_live_identity(
    tmp_path: Path, crash_at: int
) -> None:
    async with world(tmp_path) as w:
        gid = await w.create()
        arm(crash_at)
        crashed = False
        try:
            await w.goals.switch_identity(gid, Ctx.new(), model="p/new", agent="new")
        except Crash:
            crashed = True
        finally:
            arm(None)
        assert crashed
        restarted = w.fresh()
        await restarted.recover()
        state = await restarted.service.load(gid)
        live = await w.host.session_identity(state.worker_session_id or "")
        assert state.switch_in_flight is None
        assert (state.config.model, state.config.agent) == (live.model, live.agent)
        assert (state.config.model, state.config.agent) in {("p/old", "old"), ("p/new", "new")}
        assert state == await w.replayed(gid)


async def test_recovery_leaves_a_saga_of_a_live_process_alone_and_joins_the_original_flow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    import anyio

    from loopd_es.sagas import recovery

    monkeypatch.setattr(recovery, "CHECKPOINT_EVERY", 1)  # the open saga must survive in the checkpoint
    real_getpid = os.getpid
    async with await anyio.open_process(["sleep", "30"]) as other, world(tmp_path) as w:
        gid = await w.create()
        monkeypatch.setattr(os, "getpid", lambda: other.pid)  # the saga's owner is another, live process
        arm(8)
        ctx = Ctx.new()
        with pytest.raises(Crash):
            await w.goals.switch_identity(gid, ctx, model="p/new", agent="new")
        arm(None)
        monkeypatch.setattr(os, "getpid", real_getpid)
        assert await w.fresh().recover() == []
        assert (await w.state(gid)).switch_in_flight is not None
        checkpoint = [e for e in await w.events() if e.type == "saga.checkpoint"][-1].data_dict()
        assert [o["goal_id"] for o in checkpoint["open"]] == [gid]
        other.kill()
        await other.wait()
        reports = await w.fresh().recover()
        assert [r.outcome for r in reports] == ["rolled-back"]
        finished = [e for e in await w.events() if e.type == "saga.switch_finished"]
        assert finished[0].correlation_id == ctx.correlation_id
        assert await w.fresh().recover() == []  # the checkpoint moved past it: nothing left open
