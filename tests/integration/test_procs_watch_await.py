"""Watches and awaits on real PTY output (docs/reference/loopd.md#s7-g S71, S73, S77, S78, S80), exactly once
under concurrency."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import msgspec
import pytest

from loopd_es.errors import UsageError
from loopd_es.events.command import WatchSpec
from loopd_es.procs import awaits, owner_link, service
from tests.waits import alet_time_pass

from .test_procs_support import Env, env, store

if TYPE_CHECKING:
    from loopd_es.log.base import LogStore

pytestmark = pytest.mark.anyio
__all__ = ["env", "store"]


async def payloads(store: LogStore, cid: str, type_: str) -> list[dict[str, object]]:
    return [e.data_dict() async for e in store.read_stream(f"command-{cid}") if e.type == type_]


async def test_coalesced_watch_push(env: Env, store: LogStore) -> None:
    body = "import time\nfor l in ['starting up', 'ERROR one', 'ERROR two']: print(l, flush=True)\ntime.sleep(3)\n"
    cid = await env.start(store, "-c", body, watch=WatchSpec(filter="ERROR"))
    await env.until(store, cid, lambda s: not s.running)
    [push] = await payloads(store, cid, "command.watch-matched")
    text = str(push["text"])
    assert text.startswith('[watch "dev"]') and "ERROR one" in text and "ERROR two" in text
    assert "starting up" not in text and len(text.encode()) <= 4096 and push["pushes"] == 1


async def test_until_keep_then_later_push_and_exit(env: Env, store: LogStore) -> None:
    body = "import time\nprint('boot', flush=True)\nprint('READY', flush=True)\ntime.sleep(0.3)\nprint('foo', flush=True)\ntime.sleep(2.5)\n"
    cid = await env.start(
        store, "-c", body, watch=WatchSpec(filter="o|READY", until="READY", until_action="keep")
    )
    s = await env.until(store, cid, lambda s: s.watch_state == "until-matched")
    assert s.running
    s = await env.until(store, cid, lambda s: not s.running)
    assert (s.status, s.end_reason) == ("exited", "exit")
    pushes = await payloads(store, cid, "command.watch-matched")
    assert pushes[0]["until"] == "READY" and "foo" in str(pushes[-1]["text"]) and len(pushes) == 2


async def test_await_evidence_tail_is_bounded(env: Env, store: LogStore) -> None:
    body = (
        "import sys, time\nfor i in range(20): sys.stdout.write(f'chunk-{i} ' + 'x' * 5000 + '\\n')\n"
        "print('ENDMARKER', flush=True)\ntime.sleep(0.5)\nsys.exit(7)\n"
    )
    cid = await env.start(store, env.script("evidence", body))
    _, msg = await awaits.request_await(store, env.paths, cid, goal_id="g1", until=None, ignore_case=False)
    assert msg == 'Goal "g1" now awaits "dev" (fires once on exit).'
    await env.until(store, cid, lambda s: not s.running)
    [fired] = await payloads(store, cid, "command.await-fired")
    evidence = str(fired["evidence"])
    head, tail = evidence.split("\n", 1)
    assert "exitCode=7" in head and fired["exit_code"] == 7
    assert len(tail.encode()) <= 4096 and "ENDMARKER" in tail and "chunk-0" not in tail
    _, msg = await awaits.request_await(store, env.paths, cid, goal_id="g2", until=None, ignore_case=False)
    assert msg == 'Command "dev" already exited; wake-up delivered to goal "g2".'


async def test_await_until_fires_once_and_already_present(env: Env, store: LogStore) -> None:
    body = (
        "import time, sys\nprint('booting', flush=True)\nsys.stdin.readline()\nprint('READY player one', flush=True)\n"
        "time.sleep(0.5)\nprint('READY again', flush=True)\ntime.sleep(30)\n"
    )
    cid = await env.start(store, "-c", body)
    await env.until(store, cid, lambda s: b"booting" in env.output(cid))
    _, msg = await awaits.request_await(store, env.paths, cid, goal_id="g", until="READY", ignore_case=False)
    assert "now awaits pattern" in msg
    for i in range(50):  # output never fires an exit await, nor this one before READY
        assert (await env.state(store, cid)).await_for("g") is not None or i
    await service.command_request(store, env.paths, cid, owner_link.Write(data="Cg=="))
    await env.until(store, cid, lambda s: b"READY again" in env.output(cid))
    fired = await payloads(store, cid, "command.await-fired")
    assert len(fired) == 1 and "READY player one" in str(fired[0]["evidence"])
    assert (await env.state(store, cid)).running
    _, msg = await awaits.request_await(
        store, env.paths, cid, goal_id="late", until="READY", ignore_case=False
    )
    assert msg.startswith('Pattern "READY" already present in "dev" output')
    with pytest.raises(UsageError, match="dangerous"):
        await awaits.request_await(store, env.paths, cid, goal_id="x", until="(a+)+", ignore_case=False)
    await service.command_request(store, env.paths, cid, owner_link.Terminate())
    assert len(await payloads(store, cid, "command.await-fired")) == 2


async def test_cancel_on_goal_pause_and_on_remove(env: Env, store: LogStore) -> None:
    cid = await env.start(store, "-c", "import time\ntime.sleep(1)")
    await awaits.request_await(store, env.paths, cid, goal_id="paused-goal", until=None, ignore_case=False)
    await awaits.request_await(store, env.paths, cid, goal_id="other", until=None, ignore_case=False)
    assert await awaits.cancel_goal_awaits(store, "paused-goal", "goal paused") == 1
    await env.until(store, cid, lambda s: not s.running)
    assert [p["goal_id"] for p in await payloads(store, cid, "command.await-fired")] == ["other"]


async def test_exactly_once_with_concurrent_registrations_and_reconcilers(env: Env, store: LogStore) -> None:
    cid = await env.start(store, "-c", "import time\ntime.sleep(0.4)")
    goals = [f"g{i}" for i in range(12)]

    async def register(goal: str) -> None:
        await awaits.request_await(store, env.paths, cid, goal_id=goal, until=None, ignore_case=False)

    async def reconciler() -> None:
        for _ in range(10):
            await service.reconcile(store, env.paths)
            await alet_time_pass(0.05, "the reconcile rounds spread over the command's short life")

    async with anyio.create_task_group() as tg:
        for g in goals:
            tg.start_soon(register, g)
        for _ in range(3):
            tg.start_soon(reconciler)
    await env.until(store, cid, lambda s: not s.running)
    fired = await payloads(store, cid, "command.await-fired")
    assert sorted(str(p["goal_id"]) for p in fired) == sorted(goals)
    assert len(await payloads(store, cid, "command.exited")) == 1
    state = await env.state(store, cid)
    assert state.status == "exited" and state.awaits == ()
    assert msgspec.json.encode(fired)  # evidence payloads are plain JSON
