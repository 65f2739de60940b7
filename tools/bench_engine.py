"""Benchmark the engine: turns driven per second with 1, 100 and 1000 active goals, idle→next-prompt latency.

    python tools/bench_engine.py [--goals 1,100,1000] [--turns 300] [--quick] [--fenced | --fence-ratio]
    python tools/bench_engine.py --soak SECONDS [--engines 1|3]

Each size gets a fresh SQLite log (WAL, synchronous=FULL) and an in-memory simulated host. Setup (not timed)
records N goals with their workers and first turns. Timed: ``--turns`` turns, round-robin over the goals;
each turn the worker answers (a completed assistant message with usage), the host reports ``session.status
idle`` and ``session.idle``, and the engine stages the idle candidate, confirms it against the transcript,
accounts the usage, completes the run and sends the next prompt (about five host events and four appended
events per turn). The idle confirmation period is 0 here, so the latency is the engine's own work from the
host's idle event to the next prompt (in production the reference's 2 s quiet period comes on top, by design).

Beside it, in the same run and on a log of its own: sequential single-event appends (one commit each), the
limit a turn's appends are bound by. The engine must not scan all goals per event, so the CPU time per turn at
1000 goals should be about what it is at 1 (wall-clock turns/s on a shared machine is dominated by fsync noise;
``cpu_ms_per_turn`` counts every thread of the process). Prints one JSON object.

``--fence-ratio`` drives the same turns unfenced and fenced by the lease (as ``loopd-es run`` writes), in
alternating rounds, and prints the median ratio of fenced to unfenced turns per second.

``--soak SECONDS`` starts real ``loopd-es run`` processes (one exclusive engine, or ``--engines 3`` members
started with ``--shared``) on a fresh SQLite log with no goals and a simulated host, lets them idle, stops
them with SIGTERM and counts what they appended to the log: the figure the engine must keep at zero (its
coordination lives beside the log), extrapolated to an hour and a day, plus the streams they created.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from loopd_es.clock import FakeClock
from loopd_es.domain import goal_commands as c
from loopd_es.domain.decide import decide
from loopd_es.domain.evolve import initial
from loopd_es.domain.streams import goal_stream
from loopd_es.engine.core import Engine, EngineConfig
from loopd_es.engine.fence import FencedStore
from loopd_es.engine.lease import Lease
from loopd_es.events.catalogue import new_event
from loopd_es.events.envelope import NewEvent
from loopd_es.events.goal import GoalWorkerAssigned
from loopd_es.host import SimulatedHost
from loopd_es.host.events import AnyHostEvent, SessionIdle
from loopd_es.log import open_store


class _Collector:
    def __init__(self) -> None:
        self.events: list[AnyHostEvent] = []

    def send_nowait(self, event: AnyHostEvent) -> None:
        self.events.append(event)


async def _append_limit(path: Path, count: int) -> float:
    async with await open_store(f"sqlite:{path}") as store:
        t0 = time.perf_counter()
        for i in range(count):
            await store.append(f"s-{i % 10}", [NewEvent(type="goal.nudged", data={"goal_id": str(i)})])
        return count / (time.perf_counter() - t0)


async def _setup(store: Any, host: SimulatedHost, goals: int) -> dict[str, str]:
    """N goals created, workers assigned (straight to the log: the single-writer check would scan them all)."""
    sessions: dict[str, str] = {}
    facts = c.Facts(defaults=c.CreationDefaults(directory="/tmp"))
    for i in range(goals):
        goal_id = f"bench-{i:05d}"
        created = decide(
            c.CreateGoal(
                goal_id=goal_id,
                name=f"g{i}",
                objective="o",
                owner_session_id="owner",
                max_turns=0,
                workspace_write=False,
                model="openai/gpt-5",
                agent="build",
            ),
            initial(goal_id),
            facts,
        )
        worker = await host.create_worker(title=f"g{i}", model="openai/gpt-5", agent="build")
        sessions[goal_id] = worker.session_id
        events = [*created, GoalWorkerAssigned(goal_id=goal_id, worker_session_id=worker.session_id)]
        await store.append(goal_stream(goal_id), [new_event(e) for e in events], "no_stream")
    return sessions


async def _drive(
    goals: int, turns: int, workdir: Path, run: int = 0, *, fenced: bool = False
) -> dict[str, Any]:
    clock = FakeClock()
    host = SimulatedHost(clock=clock)
    collector = _Collector()
    host._subscribers.append(collector)  # type: ignore[arg-type]
    async with await open_store(f"sqlite:{workdir / f'engine-{run}-{goals}.db'}") as store:
        sessions = await _setup(store, host, goals)
        view: Any = store
        guard = None
        if (
            fenced
        ):  # as `loopd-es run` does: every append carries the lease token, every side effect checks it
            lease = Lease(store, "bench", clock, ttl_ms=10**9)
            assert await lease.try_acquire() is None
            view, guard = FencedStore(store, lease), lease.check
        engine = Engine(
            view, host, clock, EngineConfig(confirm_idle_ms=0), directory=str(workdir), guard=guard
        )
        await engine.start()
        engine.next_maintenance = None
        from loopd_es.app.service import Ctx

        for goal_id in sessions:  # first turns (setup)
            await engine.turns.continue_turn(goal_id, Ctx.new(), explicit=True, force=True)
        await engine.catch_up()
        collector.events.clear()
        order = list(sessions.items())
        head0 = await store.head()
        latencies: list[float] = []
        events_handled = 0
        t0, cpu0 = time.perf_counter(), time.process_time()
        for n in range(turns):
            goal_id, sid = order[n % len(order)]
            await host.reply(sid)
            pending, collector.events = collector.events, []
            started = None
            for event in pending:
                if isinstance(event, SessionIdle):
                    started = time.perf_counter()
                await engine.on_host_event(event)
                events_handled += 1
            if started is not None:
                latencies.append(time.perf_counter() - started)
            while collector.events:  # the next prompt's own events (user message, busy)
                pending, collector.events = collector.events, []
                for event in pending:
                    await engine.on_host_event(event)
                    events_handled += 1
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        appended = await store.head() - head0
        restarted = Engine(view, host, clock, EngineConfig(confirm_idle_ms=0), directory=str(workdir))
        t1 = time.perf_counter()
        await restarted.start()  # a restart: the whole log read back, timers and trackers rebuilt
        start_s = time.perf_counter() - t1
        log_events = await store.head()
    latencies.sort()
    return {
        "goals": goals,
        "fenced": fenced,
        "turns": turns,
        "turns_per_s": round(turns / elapsed, 1),
        "cpu_ms_per_turn": round(cpu / turns * 1000, 3),
        "restart_s": round(start_s, 3),
        "log_events_at_restart": log_events,
        "host_events_per_s": round(events_handled / elapsed, 1),
        "appended_events_per_s": round(appended / elapsed, 1),
        "appended_per_turn": round(appended / turns, 2),
        "idle_to_prompt_ms_p50": round(statistics.median(latencies) * 1000, 3),
        "idle_to_prompt_ms_p99": round(
            latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000, 3
        ),
    }


async def main_async(sizes: list[int], turns: int, appends: int, fenced: bool = False) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-engine-") as tmp:
        workdir = Path(tmp)
        limit = await _append_limit(workdir / "limit.db", appends)
        results = [await _drive(size, turns, workdir, i, fenced=fenced) for i, size in enumerate(sizes)]
    first = results[0]["turns_per_s"]
    for r in results:
        r["vs_first_size"] = round(r["turns_per_s"] / first, 2)
        r["cpu_vs_first_size"] = round(r["cpu_ms_per_turn"] / results[0]["cpu_ms_per_turn"], 2)
        r["appends_vs_limit"] = round(r["appended_events_per_s"] / limit, 2)
    return {
        "bench": "engine",
        "log": "sqlite (WAL, synchronous=FULL)",
        "host": "simulated, in memory",
        "append_limit_single_event_per_s": round(limit, 1),
        "sizes": results,
    }


def _soak(seconds: float, engines: int) -> dict[str, Any]:
    import os
    import signal
    import subprocess
    import sys

    async def count(url: str) -> tuple[int, list[str], int]:
        async with await open_store(url) as store:
            return await store.head(), await store.streams(), len(await store.coord_read())

    with tempfile.TemporaryDirectory(prefix="soak-engine-") as tmp:
        work = Path(tmp)
        (work / "host.json").write_text(json.dumps({"models": [{"provider": "p", "id": "m"}]}))
        url = f"sqlite:{work / 'events.db'}"
        anyio.run(count, url)  # creates the empty log
        env = {**os.environ, "LOOPD_ES_STORE": url, "LOOPD_ES_HOST": f"sim:{work / 'host.json'}"}
        flags = ["--shared"] if engines > 1 else []
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "loopd_es",
                    "run",
                    *flags,
                    "--holder",
                    f"soak{i}",
                    "--lease-ms",
                    "3000",
                ],
                cwd=work,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            for i in range(engines)
        ]
        time.sleep(seconds)
        for p in procs:
            p.send_signal(signal.SIGTERM)
        codes = [p.wait(timeout=30) for p in procs]
        head, streams, records = anyio.run(count, url)
    return {
        "bench": "engine-soak",
        "engines": engines,
        "mode": "shared" if engines > 1 else "exclusive",
        "lease_ms": 3000,
        "seconds": seconds,
        "exit_codes": codes,
        "events_appended": head,
        "events_per_hour": round(head * 3600 / seconds, 1),
        "events_per_day": round(head * 86400 / seconds, 1),
        "streams": streams,
        "coordination_records_left": records,
        "target_events_per_hour": 0,
    }


async def _fence_ratio(size: int, turns: int, rounds: int) -> dict[str, Any]:
    ratios = []
    with tempfile.TemporaryDirectory(prefix="bench-fence-") as tmp:
        for i in range(rounds):
            order = [False, True] if i % 2 == 0 else [True, False]
            out = {f: await _drive(size, turns, Path(tmp), 2 * i + f, fenced=f) for f in order}
            ratios.append(out[True]["turns_per_s"] / out[False]["turns_per_s"])
    return {
        "bench": "engine-fence-ratio",
        "goals": size,
        "turns": turns,
        "rounds": rounds,
        "fenced_vs_unfenced_median": round(statistics.median(ratios), 3),
        "ratios": [round(r, 3) for r in ratios],
        "target": 0.95,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--goals", default="1,100,1000", help="comma-separated numbers of active goals")
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--quick", action="store_true", help="small sizes (1,20) and 60 turns")
    parser.add_argument(
        "--fenced", action="store_true", help="append through the lease fence, as `loopd-es run`"
    )
    parser.add_argument("--fence-ratio", action="store_true", help="fenced vs unfenced, alternating rounds")
    parser.add_argument("--soak", type=float, default=None, metavar="SECONDS", help="idle real engines")
    parser.add_argument("--engines", type=int, default=1, help="with --soak: 1 exclusive, or N shared")
    args = parser.parse_args()
    if args.soak is not None:
        print(json.dumps(_soak(args.soak, args.engines), indent=2))
        return
    if args.fence_ratio:
        print(json.dumps(anyio.run(_fence_ratio, 20, 60 if args.quick else args.turns, 6), indent=2))
        return
    sizes = [1, 20] if args.quick else [int(x) for x in args.goals.split(",")]
    turns = 60 if args.quick else args.turns
    print(json.dumps(anyio.run(main_async, sizes, turns, 300 if args.quick else 1000, args.fenced), indent=2))


if __name__ == "__main__":
    main()
