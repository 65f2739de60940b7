"""Owner loss and restart: missing commands, deadlines already past, awaits fired once; a flooding child."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest

from loopd_es.domain.command import CommandStateError
from loopd_es.events.command import WatchSpec
from loopd_es.procs import awaits, owner_link, service
from loopd_es.procs.paths import owner_alive
from loopd_es.procs.pty import PtyChild
from tests.waits import alet_time_pass, await_until

from .test_procs_support import Env, env, store

if TYPE_CHECKING:
    from loopd_es.log.base import LogStore

pytestmark = pytest.mark.anyio
__all__ = ["env", "store"]

SLEEPER = "import time\nprint('ready', flush=True)\ntime.sleep(60)\n"


async def _lose_owner(env: Env, store: LogStore, cid: str) -> None:
    s = await env.until(store, cid, lambda s: s.supervisor_pid is not None and b"ready" in env.output(cid))
    assert s.supervisor_pid and s.pid
    os.kill(s.supervisor_pid, signal.SIGKILL)
    with contextlib.suppress(
        ProcessLookupError
    ):  # the child may go first: its terminal hung up with its owner
        os.killpg(s.pid, signal.SIGKILL)
    await await_until(
        f"command {cid}'s owner to let go of its lock", lambda: not owner_alive(env.paths.lock(cid))
    )


async def test_a_command_ends_with_its_owner_killed_with_minus_9(env: Env, store: LogStore) -> None:
    """The owner's terminal hangs up when the owner dies: the command gets SIGHUP and ends (it ignored it, as
    its owner does, and lived on, out of reach of ``cmd kill``, holding whatever port it had)."""
    cid = await env.start(store, "-c", SLEEPER)
    s = await env.until(store, cid, lambda s: s.supervisor_pid is not None and b"ready" in env.output(cid))
    assert s.supervisor_pid and s.pid
    os.kill(s.supervisor_pid, signal.SIGKILL)

    def gone(pid: int) -> bool:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            return True
        return stat.rsplit(") ", 1)[1].startswith("Z")  # ended, not yet reaped

    child = s.pid
    await await_until(f"the command's process {child} to end with its owner", lambda: gone(child))


async def test_restart_marks_missing_and_fires_awaits_once(env: Env, store: LogStore) -> None:
    t0 = time.monotonic()
    cid = await env.start(store, "-c", SLEEPER, watch=WatchSpec(filter="x"))
    await awaits.request_await(store, env.paths, cid, goal_id="g", until=None, ignore_case=False)
    await _lose_owner(env, store, cid)
    # The second command's owner must be gone before its deadline, or the owner enforces it itself: give it
    # three times what starting and losing the first one took on this machine, now.
    lose_s = time.monotonic() - t0
    late = await env.start(store, "-c", SLEEPER, timeout_seconds=math.ceil(3 * lose_s))
    await _lose_owner(env, store, late)
    deadline = (await env.state(store, late)).deadline_at
    assert deadline is not None
    await alet_time_pass(
        max(0.0, (deadline - datetime.now(UTC)).total_seconds()) + 0.05,
        "the command's deadline passes while nobody owns it",
    )
    results = []

    async def reconciler() -> None:
        results.append(await service.reconcile(store, env.paths))

    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(reconciler)
    # Exactly once per command across the four: a live owner's start-up reconcile (which may run late on a
    # loaded machine) can be the one that marks a command, so count the exits recorded, not who recorded them.
    assert 1 <= sum(results) <= 2
    for stream in (cid, late):
        assert [e.type async for e in store.read_stream(f"command-{stream}")].count("command.exited") == 1
    s = await env.state(store, cid)
    assert (s.status, s.end_reason) == ("missing", "missing") and s.watch == WatchSpec(filter="x")
    assert s.last_error and "no live execution" in s.last_error.lower()
    s2 = await env.state(store, late)
    # the reference's S67: each missing/missing, a passed deadline said in lastError
    assert (s2.status, s2.end_reason) == ("missing", "missing") and "timeout" in (s2.last_error or "")
    fired = [e async for e in store.read_stream(f"command-{cid}") if e.type == "command.await-fired"]
    assert len(fired) == 1 and fired[0].data_dict()["status"] == "missing"
    with pytest.raises(CommandStateError, match="^Command is missing; nothing to terminate.$"):
        await service.command_request(store, env.paths, cid, owner_link.Terminate())
    assert await service.command_request(store, env.paths, cid, owner_link.Terminate(remove=True)) == (
        "Command was already missing; removed."
    )


async def test_owner_loop_stays_responsive_while_a_child_floods(env: Env, store: LogStore) -> None:
    flood = "import sys\nwhile True: sys.stdout.write('flood line with some text ERROR\\n')\n"
    quiet = await env.start(store, "-c", SLEEPER)
    await env.until(store, quiet, lambda s: s.supervisor_pid is not None and b"ready" in env.output(quiet))
    cid = await env.start(store, "-c", flood, watch=WatchSpec(filter="ERROR"))
    await env.until(store, cid, lambda s: s.watch_state == "flood-suspended")

    async def worst_status(of: str) -> float:
        worst = 0.0
        for _ in range(10):
            t0 = time.monotonic()
            live = await owner_link.owner_request(env.paths, of, owner_link.Status())
            worst = max(worst, time.monotonic() - t0)
            assert live is not None and live.ok
        return worst

    # A pump that never yields while data is always ready answers only when the flood pauses, and this one never
    # pauses. The bound is what a quiet owner takes on this machine now (a loaded machine slows both alike).
    quiet_worst = await worst_status(quiet)
    flooded_worst = await worst_status(cid)
    assert flooded_worst < max(1.0, 10 * quiet_worst), (flooded_worst, quiet_worst)

    async def streamed() -> int:
        live = await owner_link.owner_request(env.paths, cid, owner_link.Status())
        return (live.stream_bytes or 0) if live is not None else 0

    # the flood goes on under the suspension: more than 1 MB passes the owner
    await await_until("more than 1 MB to pass the flooded owner", streamed, done=lambda n: n > 1_000_000)
    # the owner cuts the file back to 512 KiB once it passes 640 KiB; read from another process, it can be
    # caught between a chunk's write (at most one 64 KiB PTY read) and the cut
    assert env.paths.log(cid).stat().st_size <= (512 + 128 + 64) * 1024
    await service.command_request(store, env.paths, cid, owner_link.Terminate())
    s = await env.state(store, cid)
    assert s.status == "terminated" and s.truncated and s.output_bytes == 512 * 1024


async def test_pty_reads_never_block_the_event_loop() -> None:
    child = PtyChild.spawn(
        [sys.executable, "-c", "import sys\nfor i in range(300000): sys.stdout.write('x' * 60 + '\\n')"],
        cwd="/",
        env=dict(os.environ),
        cols=80,
        rows=24,
    )
    total = 0
    lags: list[float] = []
    started = time.monotonic()
    try:
        async with anyio.create_task_group() as tg:

            async def tick() -> float:
                """How late the event loop wakes a 5 ms sleeper."""
                t0 = time.monotonic()
                await alet_time_pass(0.005, "a ticker measures how late the event loop wakes it")
                return time.monotonic() - t0 - 0.005

            async def ticker() -> None:
                while True:
                    lags.append(await tick())

            tg.start_soon(ticker)
            while data := await child.read():
                total += len(data)
            tg.cancel_scope.cancel()
        flood_s = time.monotonic() - started
        assert await child.wait() == (0, None)
    finally:
        child.send_signal(signal.SIGKILL)
        child.close()
    # A blocking read would starve the ticker for the whole flood: one lag as long as the flood, and few ticks.
    # Judged against the flood's own length on this machine, not a fixed figure that a loaded machine breaks.
    assert total >= 300000 * 61 and len(lags) > 5
    assert max(lags) < flood_s / 2, (flood_s, max(lags), len(lags))
