"""Benchmark command sessions: lines/s through the owner's watch pipeline, and the CPU of an idle watched command.

    python tools/bench_procs.py [--lines N] [--quick]

Throughput: a child prints N lines as fast as it can; the owner reads its PTY, writes the output log, and runs
every line through ANSI stripping, the watch (flood-suspended within a second, as the reference would) and an
until-await whose pattern never matches (so every line is matched to the end). Beside it, in the same run, the
same child read from a PTY by a bare reader with no processing (the floor of the PTY itself). Both are timed
over the same span: from the child spawned to the child reaped with its output drained (for
the pipeline, the owner's own ``command.spawned`` and ``command.exited`` times, so neither the bench's polling
nor the owner's start-up counts), so both include the child interpreter's start-up. Idle CPU: a watched
``sleep`` for 60 s (``--quick``: 5 s), measured from /proc for the owner process. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio

from loopd_es.clock import parse_rfc3339
from loopd_es.domain.streams import command_stream
from loopd_es.events.command import WatchSpec
from loopd_es.log import open_store
from loopd_es.procs import awaits, owner_link, service
from loopd_es.procs.paths import CommandPaths
from loopd_es.procs.pty import PtyChild

CHILD = "import sys\nw = sys.stdout.write\nfor i in range({n}): w(f'line {{i}} some build output, ERROR maybe\\n')\n"


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _wait_for(store: Any, cid: str, done: Any) -> Any:
    with anyio.fail_after(300):
        while True:
            s = await service.load_state(store, cid)
            if s is not None and done(s):
                return s
            await anyio.sleep(0.005)


async def _bare_pty(n: int) -> tuple[float, int]:
    """The same child read by a bare PTY reader: from spawned (as the owner's ``command.spawned``) to reaped."""
    child = PtyChild.spawn(
        [sys.executable, "-c", CHILD.format(n=n)], cwd="/", env=dict(os.environ), cols=80, rows=24
    )
    t0 = time.perf_counter()
    total = 0
    while data := await child.read():
        total += len(data)
    await child.wait()
    child.close()
    return time.perf_counter() - t0, total


async def _owner_span(store: Any, cid: str) -> float:
    """Seconds from the owner's ``command.spawned`` to its ``command.exited`` (times it recorded itself)."""
    times: dict[str, datetime] = {}
    async for env in store.read_stream(command_stream(cid)):
        if env.type in ("command.spawned", "command.exited"):
            times.setdefault(env.type, parse_rfc3339(env.recorded_at))
    return (times["command.exited"] - times["command.spawned"]).total_seconds()


async def bench(lines: int, idle_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-procs-") as tmp_name:
        tmp = Path(tmp_name)
        url = f"sqlite:{tmp / 'ev.db'}"
        async with await open_store(url) as store:
            paths = CommandPaths(url)
            # owner start-up: from `cmd start` returning to the child running
            t0 = time.perf_counter()
            spec = service.StartSpec(
                title="flood",
                command=sys.executable,
                args=["-c", CHILD.format(n=lines)],
                watch=WatchSpec(filter="ERROR"),
            )
            cid, _ = await service.start_command(store, url, spec)
            t_start = time.perf_counter() - t0
            await awaits.request_await(
                store, paths, cid, goal_id="bench", until="NEVER-MATCHES-xyz", ignore_case=False
            )
            await _wait_for(store, cid, lambda s: s.pid is not None or not s.running)
            t_spawned = time.perf_counter() - t0
            state = await _wait_for(store, cid, lambda s: not s.running)
            pipeline_s = await _owner_span(store, cid)
            bare_s, bare_bytes = await _bare_pty(lines)

            spec = service.StartSpec(
                title="idle",
                command="sleep",
                args=[str(int(idle_s) + 30)],
                watch=WatchSpec(filter="ERROR", until="READY"),
            )
            idle_id, owner_pid = await service.start_command(store, url, spec)
            await anyio.sleep(1.0)  # past start-up
            cpu0, w0 = _cpu_seconds(owner_pid), time.perf_counter()
            await anyio.sleep(idle_s)
            cpu1, w1 = _cpu_seconds(owner_pid), time.perf_counter()
            await service.command_request(store, paths, idle_id, owner_link.Terminate())
    return {
        "lines": lines,
        "bytes": state.stream_bytes,
        "owner_start_returned_s": round(t_start, 4),
        "child_spawned_after_s": round(t_spawned, 3),
        "pipeline": {
            "seconds": round(pipeline_s, 3),
            "lines_per_s": round(lines / pipeline_s),
            "mb_per_s": round(state.stream_bytes / pipeline_s / 1e6, 1),
            "watch_state": state.watch_state,
            "truncated": state.truncated,
        },
        "bare_pty_reader": {
            "seconds": round(bare_s, 3),
            "lines_per_s": round(lines / bare_s),
            "bytes": bare_bytes,
        },
        "ratio_pipeline_vs_bare_pty": round(bare_s / pipeline_s, 3),
        "idle": {
            "window_s": round(w1 - w0, 2),
            "owner_cpu_s": round(cpu1 - cpu0, 4),
            "owner_cpu_percent": round(100 * (cpu1 - cpu0) / (w1 - w0), 3),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true", help="a 5 s idle window instead of 60 s")
    args = parser.parse_args()
    result = anyio.run(bench, args.lines, 5.0 if args.quick else 60.0)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
