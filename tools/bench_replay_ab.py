"""The whole-log replay (``replay_all``) of two source trees over one fleet log, each round in fresh processes.

    mkdir /tmp/before && git archive <commit> loopd_es | tar -x -C /tmp/before
    python tools/bench_replay_ab.py --before /tmp/before --goals 1000 --events 100 --rounds 10

The log is written once, by this tree, in the layout both trees read (``tools/bench_replay.py``'s fleet: goals
appended whole). In each round the two trees run one after the other in fresh processes, each taking the median
of ``--repeats`` replays, so a round's ratio compares like with like on a shared machine. Prints one JSON
document: the median seconds of each tree and the median of the per-round ratios after/before.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_replay import goal_traffic

from loopd_es.events.catalogue import new_event
from loopd_es.log import open_store

_ONE = """
import statistics, sys, time, anyio
from loopd_es.log import open_store
from loopd_es.replay.fold import replay_all
async def main(url, repeats):
    async with await open_store(url, create=False) as store:
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            states = await replay_all(store)
            times.append(time.perf_counter() - t)
        assert all(f.state.exists and not f.state.anomaly_count for f in states.values())
        return statistics.median(times)
print(anyio.run(main, sys.argv[1], int(sys.argv[2])))
"""


async def _fleet(path: Path, goals: int, per_goal: int) -> None:
    async with await open_store(f"sqlite:{path}") as store:
        for k in range(goals):
            await store.append(
                f"goal-f{k}", [new_event(e) for e in goal_traffic(f"f{k}", per_goal)], "no_stream"
            )


def measure(tree: Path, url: str, repeats: int) -> float:
    """Seconds of one replay (median of ``repeats``) by ``tree``'s code in a fresh process."""
    command = [sys.executable, "-c", _ONE, url, str(repeats)]
    text = subprocess.check_output(command, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"}, cwd=tree)
    return float(text.split()[-1])


def run(args: argparse.Namespace) -> dict[str, Any]:
    trees = {"before": Path(args.before).resolve(), "after": Path(__file__).resolve().parents[1]}
    seconds: dict[str, list[float]] = {k: [] for k in trees}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fleet.db"
        anyio.run(_fleet, path, args.goals, args.events)
        for r in range(args.rounds):
            order = list(trees) if r % 2 == 0 else list(reversed(trees))
            for name in order:
                seconds[name].append(measure(trees[name], f"sqlite:{path}", args.repeats))
    ratios = [a / b for a, b in zip(seconds["after"], seconds["before"], strict=True)]
    return {
        "goals": args.goals,
        "events_per_goal": args.events,
        "rounds": args.rounds,
        "median_s": {k: round(statistics.median(v), 4) for k, v in seconds.items()},
        "after_over_before_per_round": [round(x, 3) for x in ratios],
        "after_over_before": round(statistics.median(ratios), 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--before", required=True, help="a source tree of the code before (its loopd_es)")
    parser.add_argument("--goals", type=int, default=1000)
    parser.add_argument("--events", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    print(json.dumps(run(parser.parse_args()), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
