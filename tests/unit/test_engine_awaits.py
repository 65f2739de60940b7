"""Command awaits wake their goal exactly once (docs/reference/loopd.md#s3-18, #s7-g): evidence to the inbox,
one forced
turn, also when the await fired while no engine ran, or when the engine restarts after the wake."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopd_es.clock import parse_rfc3339
from loopd_es.engine.awaits import AwaitWaker
from loopd_es.engine.core import Engine, EngineConfig
from loopd_es.events import command as cmd
from loopd_es.events.catalogue import new_event

from ._engine_harness import Rig, rig

pytestmark = pytest.mark.anyio


async def _fire(
    r: Rig, goal_id: str, *, evidence: str = '[command "t" exited exitCode=7] tail-bytes-here'
) -> None:
    await r.store.append(
        "command-c1",
        [
            new_event(
                cmd.CommandStarted(
                    command_id="c1",
                    title="t",
                    command="sleep",
                    cwd="/",
                    started_at=parse_rfc3339("2026-12-02T00:00:00.000000Z"),
                )
            ),
            new_event(cmd.AwaitRequested(command_id="c1", goal_id=goal_id)),
            new_event(
                cmd.AwaitFired(
                    command_id="c1", goal_id=goal_id, status="exited", exit_code=7, evidence=evidence
                )
            ),
        ],
        "no_stream",
    )


async def test_an_await_wakes_an_active_goal_with_its_evidence_once(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        gid, sid = await r.started()
        await r.host.go_busy(sid)  # a wake is forced: it does not wait for the worker
        await _fire(r, gid)
        await r.engine.catch_up()
        prompts = await r.prompts(sid)
        assert (
            len(prompts) == 2 and '- [worker] [command "t" exited exitCode=7] tail-bytes-here' in prompts[1]
        )
        assert (await r.state(gid)).inbox == ()
        # a second engine reading the same log (a restart) neither records nor sends anything again
        again = Engine(r.store, r.host, r.clock, EngineConfig(), directory=str(tmp_path))
        await again.start()
        assert len(await r.prompts(sid)) == 2
        assert (await r.types(gid)).count("goal.input_queued") == 1


async def test_an_await_that_fired_while_no_engine_ran_is_delivered_at_start(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        gid, sid = await r.started()
        await _fire(r, gid)  # nobody catches up: the engine is "down"
        fresh = Engine(r.store, r.host, r.clock, EngineConfig(), directory=str(tmp_path))
        await fresh.start()
        assert len(await r.prompts(sid)) == 2
        await fresh.start()
        assert len(await r.prompts(sid)) == 2


async def test_s77_a_blocked_goal_keeps_the_evidence_for_its_retry(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        gid, sid = await r.started()
        await r.ops.force_block(gid)
        await _fire(r, gid)
        await r.engine.catch_up()
        assert len(await r.prompts(sid)) == 1
        assert [i.sender for i in (await r.state(gid)).inbox] == ["worker"]
        await r.ops.resume(gid)  # retry: the evidence rides on the real turn and leaves the inbox
        assert "tail-bytes-here" in (await r.prompts(sid))[-1]
        assert (await r.state(gid)).inbox == ()


async def test_an_await_discarded_because_its_command_is_gone_tells_the_goal_why(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        gid, sid = await r.started()
        await r.store.append(
            "command-c2",
            [new_event(cmd.AwaitDiscarded(command_id="c2", goal_id=gid, reason="command record gone"))],
            "no_stream",
        )
        await r.engine.catch_up()
        assert "discarded: command record gone" in (await r.prompts(sid))[-1]


async def test_a_prompt_delivered_just_before_a_crash_is_not_resent_and_its_inbox_is_marked_delivered(
    tmp_path: Path,
) -> None:
    from loopd_es.app.service import Ctx
    from loopd_es.domain import goal_commands as c

    async with rig(tmp_path) as r:
        gid, sid = await r.started()
        await r.ops.service.execute(c.SendInput(goal_id=gid, input_id="in-1", text="use pnpm"), Ctx.new())
        state = await r.state(gid)
        # the turn was recorded and its prompt delivered, then the process died before recording the delivery
        await r.ops.service.execute(
            c.StartRun(goal_id=gid, run_id="run-x", prompt_message_id="msg_x", kind="bare"), Ctx.new()
        )
        await r.host.prompt(sid, "[user] use pnpm", prompt_id="msg_x")
        assert [i.input_id for i in (await r.state(gid)).inbox] == ["in-1"] and state.inbox
        fresh = Engine(r.store, r.host, r.clock, EngineConfig(), directory=str(tmp_path))
        await fresh.start()
        assert (await r.state(gid)).inbox == ()
        assert len(await r.prompts(sid)) == 2  # the first turn and the bare one, nothing resent


async def test_a_replayed_fire_that_missed_its_queued_evidence_records_it_once(tmp_path: Path) -> None:
    """A member that reacts to a fire whose evidence another member queued a moment ago (not read yet) decides it
    again: the evidence's event id comes from the fire, so the log answers with the original and the goal keeps
    one copy."""
    async with rig(tmp_path) as r:
        gid, sid = await r.started()
        await _fire(r, gid)
        await r.engine.catch_up()
        assert (await r.types(gid)).count("goal.input_queued") == 1
        fire = [e async for e in r.store.read_all(types=["command.await-fired"])][-1]
        late = AwaitWaker(r.engine.service, r.engine)  # knows nothing of what the log holds
        await late.react(fire)
        assert (await r.types(gid)).count("goal.input_queued") == 1
        assert (await r.types(gid)).count("goal.nudged") == 1, "the evidence was delivered: no second wake"
        assert len(await r.prompts(sid)) == 2
