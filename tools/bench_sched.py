"""Scheduler speed: due-slot detection per tick with 10 / 1,000 / 100,000 tasks (the due-time index against a
scan of every task, measured in the same run), and fire latency from due time to host injection.

Usage: ``python tools/bench_sched.py [--sizes 10,1000,100000] [--ticks 200] [--latency-tasks 20]
[--latency-seconds 10]``. Prints one JSON object.

Detection: tasks of random intervals (1 min .. 1 h) in sessions of 10, folded from ``loop.task_created``
events by the scheduler's own fold; each tick advances a second, takes what is due from the index
(:class:`~loopd_es.domain.loop.due.DueIndex`) and re-arms it, exactly as a fire would. The peer is the reference's
way: look at every task's due time on every tick.

Latency: a real SQLite log, the in-memory simulated host, ``--latency-tasks`` 1-second tasks (no jitter),
one :class:`~loopd_es.sched.runner.Scheduler` sleeping until the next due time as ``loopd-es loop run`` does.
Latency = when the host received the prompt - the slot's nominal due time. Its floor is measured in the same
run: the cost of one durable SQLite commit (``append_floor_ms_p50``); a fire makes two before the host call
(taking the session's fire record, the ``loop.slot_claimed`` append) and two after it (the outcome, the
release). The reference's peer is its 5 s ticker (a due task fires up to 5 s late).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loopd_es.clock import SystemClock, from_ms, ms_between, parse_rfc3339, to_ms
from loopd_es.domain.loop import decide
from loopd_es.domain.loop.due import DueIndex
from loopd_es.domain.loop.model import SessionLoops, evolve
from loopd_es.events import loop as ev
from loopd_es.events.catalogue import new_event
from loopd_es.host.sim_script import HostScript, ScriptSession
from loopd_es.host.simulated import SimulatedHost
from loopd_es.log import open_store
from loopd_es.sched import service
from loopd_es.sched.runner import Scheduler


def detection(n: int, ticks: int, seed: int = 1) -> dict[str, Any]:
    rng = random.Random(seed)
    t0 = from_ms(1_800_000_000_000)
    sessions: dict[str, SessionLoops] = {}
    for i in range(n):
        sid = f"s{i // 10}"
        s = sessions.setdefault(sid, SessionLoops(session_id=sid))
        iv = rng.randrange(60_000, 3_600_000, 1000)
        evolve(s, ev.TaskCreated(task_id=f"t{i}", origin_id=f"m{i}", session_id=sid, prompt="p", mode="fixed",
                                 interval_ms=iv, jitter=False, created_at=t0, next_due_at=t0 + timedelta(milliseconds=rng.randrange(iv))))  # fmt: skip
    tasks = [(sid, t) for sid, s in sessions.items() for t in s.tasks.values()]
    index = DueIndex()
    for sid, t in tasks:
        index.push(t.due_at(), sid, t.task_id)

    def current(sid: str, tid: str) -> datetime | None:
        return sessions[sid].tasks[tid].due_at()

    def rearm(sid: str, tid: str, now: datetime) -> None:
        t = sessions[sid].tasks[tid]
        t.next_due_at = now + timedelta(milliseconds=t.interval_ms or 0)
        index.push(t.next_due_at, sid, tid)

    due_index = due_scan = 0
    start = time.perf_counter()
    for k in range(ticks):
        now = t0 + timedelta(seconds=k)
        for _, sid, tid in index.pop_due(now, current):
            due_index += 1
            rearm(sid, tid, now)
    index_s = time.perf_counter() - start
    for _, t in tasks:  # same schedule again for the scan
        t.next_due_at = None
    rng = random.Random(seed)
    for _sid, t in tasks:
        iv = rng.randrange(60_000, 3_600_000, 1000)
        t.next_due_at = t0 + timedelta(milliseconds=rng.randrange(iv))
    start = time.perf_counter()
    for k in range(ticks):
        now = t0 + timedelta(seconds=k)
        for _sid, t in tasks:
            d = t.due_at()
            if d is not None and d <= now:
                due_scan += 1
                t.next_due_at = now + timedelta(milliseconds=t.interval_ms or 0)
    scan_s = time.perf_counter() - start
    return {
        "tasks": n, "ticks": ticks, "due_found_index": due_index, "due_found_scan": due_scan,
        "index_us_per_tick": round(index_s / ticks * 1e6, 1), "scan_us_per_tick": round(scan_s / ticks * 1e6, 1),
        "scan_over_index": round(scan_s / index_s, 1) if index_s else None,
    }  # fmt: skip


class _Recording(SimulatedHost):
    def __init__(self, script: HostScript) -> None:
        super().__init__(script)
        self.seen: dict[str, int] = {}

    async def prompt(self, session_id: str, text: str, **kw: Any) -> Any:
        self.seen[str(kw.get("prompt_id"))] = time.time_ns() // 1_000_000
        return await super().prompt(session_id, text, **kw)


async def latency(n: int, seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        host = _Recording(HostScript(sessions=tuple(ScriptSession(id=f"s{i}") for i in range(n))))
        async with await open_store(f"sqlite:{Path(tmp) / 'ev.db'}") as store:
            floor = []
            for i in range(50):
                t = time.perf_counter()
                await store.append(
                    "bench-floor", [new_event(ev.SessionActivated(session_id="x", at=from_ms(i)))]
                )
                floor.append((time.perf_counter() - t) * 1000)
            now = from_ms(time.time_ns() // 1_000_000 + 500)
            for i in range(n):
                await service.handle(store, "1s --jitter=false ping", session_id=f"s{i}", now=now,
                                     cfg=decide.Config(), origin_id=f"m{i}", directory=Path(tmp), home=Path(tmp))  # fmt: skip
            clock = SystemClock()
            sched = Scheduler(store, host, clock, claimer="bench", all_sessions=True)
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                await sched.fire_due()
                wake = sched.next_wake()
                await anyio.sleep(max(0.0, ms_between(wake, clock.now()) / 1000 if wake else 0.1))
            lat = []
            async for env in store.read_all():
                if env.type == "loop.slot_claimed":
                    e = msgjson(env)
                    seen = host.seen.get(f"loop-{e['task_id']}-{e['slot']}")
                    if seen is not None:
                        lat.append(seen - to_ms(parse_rfc3339(e["due_at"])))
    lat.sort()
    return {
        "tasks": n, "seconds": seconds, "fires": len(lat),
        "p50_ms": statistics.median(lat) if lat else None,
        "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else None,
        "append_floor_ms_p50": round(statistics.median(floor), 2),
        "reference_ticker_worst_ms": 5000,
    }  # fmt: skip


def msgjson(env: Any) -> dict[str, Any]:
    out: dict[str, Any] = env.data_dict()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10,1000,100000")
    ap.add_argument("--ticks", type=int, default=200)
    ap.add_argument("--latency-tasks", type=int, default=20)
    ap.add_argument("--latency-seconds", type=float, default=10.0)
    a = ap.parse_args()
    result = {
        "detection": [detection(int(n), a.ticks) for n in a.sizes.split(",")],
        "fire_latency": anyio.run(latency, a.latency_tasks, a.latency_seconds),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
