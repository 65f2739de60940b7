"""Benchmark ``loopd-es mirror-loopd --follow``: how long after loopd writes a ledger line its events are in the log.

    python tools/bench_mirror.py                       # 10 goals x 3 lives (330 lines) at ~60 lines/s
    python tools/bench_mirror.py --goals 4 --cycles 1  # a quick look

A writer process (:mod:`loopd_es.testing.loopd_project`) plays a busy opencode-loopd project: state.json
rewritten atomically before every ledger line, one rotation and one torn tail on the way. The mirror runs
in its own process (``--json``), printing when each pass landed and which ledger lines it carried. The lag
of a line is the time from the writer's flush of it to the landing of the pass that carried it (both
``time.time()`` on this machine). Prints one JSON document with p50/p99/max and the ratio of p99 to the
limit (1 s): below 1 is within it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loopd_es.testing.loopd_project import empty_project, start_mirror  # noqa: E402

LIMIT_MS = 1000.0


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _collect(stream: IO[str], landed: dict[int, float]) -> None:
    """Record when the first pass carrying each ledger line landed, until the mirror's stdout closes."""
    with stream:
        for line in stream:
            doc = json.loads(line)
            for n in doc["ledger_lines"]:
                landed.setdefault(n, doc["landed_at"])


def run(goals: int, cycles: int, pace: float) -> dict[str, Any]:
    """One measured run in a fresh directory; returns the document to print."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("LOOPD_ES_STORE", None)
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp) / "project"
        empty_project(project)
        url = f"sqlite:{Path(tmp) / 'mirror.db'}"
        mirror = start_mirror(url, project, env)
        assert mirror.stdout is not None
        json.loads(mirror.stdout.readline())  # the first pass: it is watching now
        landed: dict[int, float] = {}
        reader = threading.Thread(target=_collect, args=(mirror.stdout, landed), daemon=True)
        reader.start()  # read as it prints: a full pipe would stall the mirror and inflate the lag
        lines = goals * 11 * cycles
        writer = subprocess.run(
            [sys.executable, "-m", "loopd_es.testing.loopd_project", str(project), "--goals", str(goals)]
            + ["--cycles", str(cycles), "--pace", str(pace)]
            + ["--rotate-at", str(lines // 2), "--torn-at", str(lines // 3)],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        written = {d["line"]: d["at"] for d in map(json.loads, writer.stdout.splitlines()) if "line" in d}
        deadline = time.monotonic() + 30
        while len(landed) < len(written) and time.monotonic() < deadline:
            time.sleep(0.05)  # the reader thread fills `landed`; this only bounds the wait
        mirror.terminate()
        mirror.wait(10)
        reader.join(10)
    lags = [(landed[n] - at) * 1000 for n, at in written.items() if n in landed]
    p99 = _percentile(lags, 0.99)
    return {
        "bench": "mirror-loopd --follow lag (ledger line written -> its events in the log)",
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "ledger_lines": len(written),
        "mirrored": len(lags),
        "lines_per_second": round(len(written) / max(1e-9, max(written.values()) - min(written.values())), 1),
        "lag_ms": {
            "p50": round(statistics.median(lags), 1),
            "p99": round(p99, 1),
            "max": round(max(lags), 1),
        },
        "limit_ms": LIMIT_MS,
        "p99_to_limit": round(p99 / LIMIT_MS, 3),
        "ok": len(lags) == len(written) and p99 < LIMIT_MS,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--goals", type=int, default=10)
    p.add_argument("--cycles", type=int, default=3)
    p.add_argument("--pace", type=float, default=0.01, help="seconds between the writer's steps")
    args = p.parse_args()
    doc = run(args.goals, args.cycles, args.pace)
    print(json.dumps(doc, indent=2))
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
