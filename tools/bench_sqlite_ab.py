"""SQLite appends of two source trees and of ``eventsourcing``, each round in fresh processes, in rotating order.

    mkdir /tmp/before && git archive <commit> loopd_es tools | tar -x -C /tmp/before
    python tools/bench_sqlite_ab.py --before /tmp/before --events 500 --batch 1 --rounds 9

On a shared machine the wall-clock rate of one run moves by 2x with the neighbours' load. Here the two trees
and the peer run one after another in each round, so a ratio of the same round compares like with like.
Prints one JSON document: the median rates, and the medians of the per-round ratios after/before,
after/peer, before/peer, and of each tree over ``raw``: plain sqlite3 writing the same rows (the limit of
any Python path, ``tools/bench_log_sqlite.py``'s ``_raw_own_row``). Each measurement is that file's own loop.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

_ONE = """
import sys, anyio
from pathlib import Path
sys.path.insert(0, sys.argv[1] + "/tools")
import bench_log_sqlite as b
path, n, size, who = Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
if who == "peer":
    print(b._peer_appends(path, n, size))
elif who == "raw":
    print(b._raw_own_row(path, n, size))
else:
    print(anyio.run(b._mine_appends, path, n, size))
"""


def measure(tree: Path, who: str, events: int, batch: int, directory: Path) -> float:
    """Events/s of one run of ``tree``'s code (or of the peer) in a fresh process."""
    db = directory / f"{who}-{os.urandom(6).hex()}.db"
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run(
        [sys.executable, "-c", _ONE, str(tree), str(db), str(events), str(batch), who],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.split()[-1])


def run(args: argparse.Namespace) -> dict[str, Any]:
    trees = {"before": Path(args.before).resolve(), "after": Path(__file__).resolve().parents[1]}
    kinds = ["before", "after", "peer", "raw"]
    rates: dict[str, list[float]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for who in kinds if r % 2 == 0 else kinds[::-1]:
                tree = trees["after"] if who in ("peer", "raw") else trees[who]
                rates[who].append(measure(tree, who, args.events, args.batch, Path(tmp)))

    def ratio(a: str, b: str) -> float:
        return round(statistics.median(x / y for x, y in zip(rates[a], rates[b], strict=True)), 3)

    return {
        "params": vars(args),
        "load_average_end": os.getloadavg()[0],
        "events_per_s": {k: round(statistics.median(v)) for k, v in rates.items()},
        "runs": rates,
        "after_over_before": ratio("after", "before"),
        "after_over_peer": ratio("after", "peer"),
        "before_over_peer": ratio("before", "peer"),
        "after_over_raw": ratio("after", "raw"),
        "before_over_raw": ratio("before", "raw"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--before", required=True, help="a directory holding the other tree's loopd_es and tools"
    )
    parser.add_argument("--events", type=int, default=500, help="events per run")
    parser.add_argument("--batch", type=int, default=1, help="events per append")
    parser.add_argument("--rounds", type=int, default=9)
    print(json.dumps(run(parser.parse_args(argv)), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
