"""Benchmark the OpenCode tool calls against a log with many goals: 200 concurrent owner and worker calls.

    python tools/bench_tools.py [--goals 3000] [--calls 200] [--rounds 3]

A fresh SQLite log gets ``--goals`` goals (straight to the log, as ``tools/bench_engine.py`` sets them up), each
owned by one of 100 owner sessions and worked by a session of its own that exists on the simulated host (so a
nudge's prompt is delivered, as in use; without the session every nudge recorded a failed run instead). Then ``--calls`` tool calls are made at
once through the engine's tool dispatcher (what the tool channel runs for each request): rounds of reads
(``list_background_goals`` by an owner, ``get_goal`` by a worker), then mixed rounds where a third are
``nudge_goal`` by an owner (which appends durably and prompts the worker). Each call's latency is measured from
the moment all were started; the target is p99 < 100 ms.
Beside it, in the same run: the old way, every call folding every goal (a dispatcher whose index is bypassed),
on a sample of calls, so the ratio is measured, not remembered. Prints one JSON object.
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
from loopd_es.engine.tool_api import ToolCall, ToolDispatcher
from loopd_es.events.catalogue import new_event
from loopd_es.events.goal import GoalWorkerAssigned
from loopd_es.host import SimulatedHost
from loopd_es.log import open_store

OWNERS = 100


async def _setup(store: Any, host: SimulatedHost, goals: int) -> list[str]:
    """The goals, and their worker sessions (created on ``host``) in goal order."""
    facts = c.Facts(defaults=c.CreationDefaults(directory="/tmp"))
    workers = []
    for i in range(goals):
        goal_id = f"bench-{i:05d}"
        created = decide(
            c.CreateGoal(
                goal_id=goal_id, name=f"g{i}", objective="o", owner_session_id=f"owner-{i % OWNERS}",
                max_turns=0, workspace_write=False, model="openai/gpt-5", agent="build", interactive=True,
            ),
            initial(goal_id),
            facts,
        )  # fmt: skip
        worker = (
            await host.create_worker(title=f"loopd: g{i}", model="openai/gpt-5", agent="build")
        ).session_id
        workers.append(worker)
        events = [*created, GoalWorkerAssigned(goal_id=goal_id, worker_session_id=worker)]
        await store.append(goal_stream(goal_id), [new_event(e) for e in events], "no_stream")
    return workers


def _call(i: int, workers: list[str], *, writes: bool = True) -> ToolCall:
    kind = i % 3 if writes else i % 2
    goals = len(workers)
    if kind == 0:
        return ToolCall(tool="list_background_goals", context={"sessionID": f"owner-{i % OWNERS}"})
    if kind == 1:
        return ToolCall(tool="get_goal", context={"sessionID": workers[(i * 7) % goals]})
    goal = (i * 13) % goals
    return ToolCall(
        tool="nudge_goal",
        args={"goal_id": f"bench-{goal:05d}"},
        context={"sessionID": f"owner-{goal % OWNERS}"},
    )


async def _round(
    dispatcher: ToolDispatcher, calls: int, workers: list[str], *, writes: bool = True
) -> list[float]:
    latencies: list[float] = []
    start = time.perf_counter()

    async def one(i: int) -> None:
        call = _call(i, workers, writes=writes)
        reply = await dispatcher.call(call)
        assert reply.get("ok") is True, (call, reply)  # a refused or failed call would measure the wrong path
        latencies.append(time.perf_counter() - start)

    async with anyio.create_task_group() as tg:
        for i in range(calls):
            tg.start_soon(one, i)
    return sorted(latencies)


def _p(values: list[float], q: float) -> float:
    return round(values[min(len(values) - 1, int(len(values) * q))] * 1000, 1)


async def main_async(goals: int, calls: int, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-tools-") as tmp:
        async with await open_store(f"sqlite:{Path(tmp) / 'events.db'}") as store:
            clock = FakeClock()
            host = SimulatedHost(clock=clock)
            workers = await _setup(store, host, goals)
            dispatcher = ToolDispatcher(store, host, clock, tmp)
            assert dispatcher.index is not None
            await dispatcher.index.catch_up()  # the engine's dispatcher lives as long as the engine
            reads = [await _round(dispatcher, calls, workers, writes=False) for _ in range(rounds)]
            runs = [await _round(dispatcher, calls, workers) for _ in range(rounds)]
            old = ToolDispatcher(store, host, clock, tmp)
            old.index = None
            t0 = time.perf_counter()
            sample = 6
            for i in range(sample):
                await old.call(_call(i, workers))
            old_per_call = (time.perf_counter() - t0) / sample
    p99s = [_p(r, 0.99) for r in runs]
    read_p99s = [_p(r, 0.99) for r in reads]
    return {
        "bench": "tools",
        "log": "sqlite (WAL, synchronous=FULL)",
        "goals": goals,
        "concurrent_calls": calls,
        "rounds": rounds,
        "target_p99_ms": 100,
        "reads": {
            "calls": "list_background_goals and get_goal, half each",
            "p50_ms": [_p(r, 0.5) for r in reads],
            "p99_ms": read_p99s,
            "p99_vs_target": round(statistics.median(read_p99s) / 100, 2),
        },
        "mixed": {
            "calls": "a third nudge_goal (each appends and prompts, fsync per commit)",
            "p50_ms": [_p(r, 0.5) for r in runs],
            "p99_ms": p99s,
            "p99_vs_target": round(statistics.median(p99s) / 100, 2),
        },
        "fold_every_goal_ms_per_call": round(old_per_call * 1000, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--goals", type=int, default=3000)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(json.dumps(anyio.run(main_async, args.goals, args.calls, args.rounds), indent=2))


if __name__ == "__main__":
    main()
