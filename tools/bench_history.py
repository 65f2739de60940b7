"""``history`` of a goal with 10k events inside a 1M-event log, process start included (target < 300 ms).

Builds the log once (SQLite, big batches through the store API: 1,000 background goals of mixed goal/run events
plus the measured goal, whose events are spread over the whole log), runs the ``goal_links`` projector once,
then times ``python -m loopd_es history GOAL`` as a subprocess (the interpreter itself, not a pyenv shim),
best and median of several runs, beside ``python -m loopd_es --help`` (the CLI's start-up alone) measured in
the same run. Prints one JSON document.

    python tools/bench_history.py [--events 1000000] [--goal-events 10000] [--dir DIR] [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from loopd_es.events import goal as g
from loopd_es.events import run as r
from loopd_es.events.catalogue import new_event
from loopd_es.log import open_store

if TYPE_CHECKING:
    from loopd_es.events.base import Event

TARGET_MS = 300.0
GOAL = "bench-goal-0000"
REGISTRY = "bench_history_registry"


def _goal_events(goal_id: str, count: int) -> list[Event]:
    """A plausible goal stream: created, then turns (started, usage, progress, completed)."""
    events: list[Event] = [
        g.GoalCreated(goal_id=goal_id, name=goal_id, objective="bench", owner_session_id="o")
    ]
    turn = 0
    while len(events) < count:
        turn += 1
        run_id = f"{goal_id}-r{turn}"
        events += [
            r.RunStarted(
                goal_id=goal_id, run_id=run_id, generation=turn, prompt_message_id="m", turn_count=turn
            ),
            g.GoalUsageAccounted(goal_id=goal_id, message_ids=(f"{run_id}-m",), token_delta=100),
            g.GoalProgressReported(goal_id=goal_id, summary=f"step {turn}"),
            r.RunCompleted(goal_id=goal_id, run_id=run_id, generation=turn),
        ]
    return events[:count]


async def build(url: str, total: int, goal_events: int, background: int = 1000) -> None:
    """Append ``total`` events: the measured goal's in slices between background goals' batches."""
    per_goal = (total - goal_events) // background
    mine = _goal_events(GOAL, goal_events)
    slices = max(1, background // 10)
    step = -(-goal_events // slices)
    started = time.perf_counter()
    async with await open_store(url) as store:
        for k in range(background):
            gid = f"bg-{k:05d}"
            await store.append(f"goal-{gid}", [new_event(e) for e in _goal_events(gid, per_goal)])
            if k % 10 == 0 and mine:
                await store.append(f"goal-{GOAL}", [new_event(e) for e in mine[:step]])
                mine = mine[step:]
        if mine:
            await store.append(f"goal-{GOAL}", [new_event(e) for e in mine])
        head = await store.head()
    print(f"built {head} events in {time.perf_counter() - started:.1f}s", file=sys.stderr)


async def project(url: str, read_db: Path) -> float:
    from loopd_es.projector import Projector
    from projections.goal_links import GoalLinks

    started = time.perf_counter()
    async with (
        await open_store(url) as store,
        await Projector.open(store, [GoalLinks()], read_db) as projector,
    ):
        await projector.run_once()
    return time.perf_counter() - started


def timed(argv: list[str], env: dict[str, str], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
        out.append((time.perf_counter() - started) * 1000)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed: {done.stderr.decode()[-500:]}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--goal-events", type=int, default=10_000)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/loopd-bench-history"))
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    db = args.dir / f"events-{args.events}-{args.goal_events}.db"
    url = f"sqlite:{db}"
    if not db.exists():
        anyio.run(build, url, args.events, args.goal_events)
    read_db = db.with_suffix(".read.db")  # one read db per log: a read db refuses to follow another log
    projector_s = anyio.run(project, url, read_db)
    # A registry holding goal_links only, so the run does not depend on what projections/ registers today.
    (args.dir / f"{REGISTRY}.py").write_text(
        "from projections.goal_links import GoalLinks\n\nALL = [GoalLinks()]\n"
    )
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(args.dir), root])}
    history = [
        sys.executable,
        "-m",
        "loopd_es",
        "--store",
        url,
        "history",
        GOAL,
        "--registry",
        REGISTRY,
        "--read-db",
        str(read_db),
    ]
    timed(history, env, 1)  # warm the page cache once
    runs = timed(history, env, args.runs)
    startup = timed([sys.executable, "-m", "loopd_es", "--help"], env, args.runs)
    best, median = min(runs), statistics.median(runs)
    result: dict[str, Any] = {
        "log_events": args.events,
        "goal_events": args.goal_events,
        "history_ms_best": round(best, 1),
        "history_ms_median": round(median, 1),
        "cli_startup_ms_median": round(statistics.median(startup), 1),
        "history_work_ms_median": round(median - statistics.median(startup), 1),
        "projector_catch_up_s": round(projector_s, 2),
        "target_ms": TARGET_MS,
        "pass": median < TARGET_MS,
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
