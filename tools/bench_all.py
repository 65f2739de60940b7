"""Run every benchmark with its peer and limit, and keep the run: one JSON file under ``docs/bench/``.

    python tools/bench_all.py            # every benchmark, sized to finish in about ten minutes on 2 cores
    python tools/bench_all.py --quick    # the issue-26 rows only (log vs eventsourcing, replay, CLI), smaller
    python tools/bench_all.py --only log_sqlite,cli --venv /tmp/venv/bin/python

Each benchmark runs as a child process (``tools/bench_*.py``, which prints JSON with its peer or limit measured
in the same run) under a time limit; a benchmark that needs what is not here (a PostgreSQL server in
``$LOOPD_ES_TEST_POSTGRES``, OpenCode from ``tools/opencode_setup.sh``) is recorded as skipped, with why. The
file records the machine (CPU, cores, memory, Python, SQLite), the load average before and after each
benchmark, the commit (and whether the tree had changes), and a summary of the ratio rows of issue 26.
``docs/performance.md`` quotes these files; a figure no committed file backs does not go in the docs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "bench"
PG_ENV = "LOOPD_ES_TEST_POSTGRES"

Plan = dict[str, tuple[list[str], float]]
"""Benchmark name -> (arguments of ``tools/bench_<name>.py``, seconds it may take)."""

QUICK: Plan = {
    "log_sqlite": (
        [
            "--single",
            "300",
            "--batch-events",
            "5000",
            "--read-events",
            "50000",
            "--scale",
            "10000",
            "--runs",
            "3",
        ],
        240,
    ),
    "replay": (["--events", "100000", "--goal-events", "10000", "--repeats", "3", "--fleet-goals", "0"], 180),
    "postgres": (["--seconds", "1", "--runs", "1", "--processes", "1", "4", "--no-lag", "--no-read"], 180),
    "cli": (["--rounds", "5"], 180),
}

FULL: Plan = {
    "log_sqlite": (
        [
            "--single", "1000", "--batch-events", "20000", "--read-events", "200000",
            "--scale", "10000", "--runs", "5",
        ],
        420,
    ),
    "replay": (
        ["--events", "100000", "--goal-events", "10000", "--repeats", "5", "--fleet-goals", "1000"],
        300,
    ),
    "postgres": (
        ["--seconds", "1.5", "--runs", "3", "--processes", "1", "4", "--lag-appends", "200", "--read-events", "50000"],
        420,
    ),
    "cli": (["--rounds", "11"], 300),
    "log": (
        [
            "--backends", "ndjson", "--events", "100000", "--read-events", "100000", "--single", "500",
            "--batch-events", "20000", "--runs", "3", "--figures", "a_single_append", "c_batch_100", "d_read_all",
        ],
        300,
    ),
    "history": (["--events", "100000", "--goal-events", "10000", "--runs", "5"], 300),
    "engine": (["--quick"], 300),
    "sched": (["--sizes", "10,1000,10000", "--ticks", "100", "--latency-tasks", "5", "--latency-seconds", "4"], 180),
    "tools": (["--goals", "1000", "--calls", "100", "--rounds", "1"], 180),
    "projector": (["--events", "100000", "--seconds", "2", "--backends", "sqlite"], 240),
    "rebuild": (["--events", "100000", "--runs", "1"], 300),
    "procs": (["--quick", "--lines", "100000"], 180),
    "opencode": (["--turns", "20", "--goals", "10", "--breakdown"], 300),
    "sqlite_driver": (["--rounds", "8"], 240),
    "sqlite_rows": (["--single", "1000", "--batch-events", "20000", "--rounds", "12"], 300),
}  # fmt: skip


def _needs(name: str) -> str | None:
    """Why benchmark ``name`` cannot run here, or None."""
    if name == "postgres" and not os.environ.get(PG_ENV):
        return f'no PostgreSQL: ${PG_ENV} is not set (eval "$(bash tools/pg_test_server.sh start)")'
    if name == "opencode" and not os.environ.get("LOOPD_ES_TEST_OPENCODE"):
        return 'no OpenCode: run eval "$(bash tools/opencode_setup.sh)" first'
    if name == "sqlite_rows" and importlib.util.find_spec("eventsourcing") is None:
        return "no eventsourcing, the peer of this one: pip install eventsourcing (not a loopd-es dependency)"
    if name == "sqlite_driver" and importlib.util.find_spec("aiosqlite") is None:
        return "no aiosqlite, the peer of this one: pip install aiosqlite (not a loopd-es dependency)"
    return None


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        mem_kb = 0
    found: dict[str, Any] = {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "memory_gb": round(mem_kb / 1024 / 1024, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
    }
    try:
        from importlib.metadata import version

        found["eventsourcing"] = version("eventsourcing")
    except Exception:  # the peer is optional: its rows are then missing, not wrong
        found["eventsourcing"] = None
    return found


def run_one(name: str, args: list[str], limit: float) -> dict[str, Any]:
    """Run ``tools/bench_<name>.py`` and return its JSON, with its wall time and the load around it."""
    record: dict[str, Any] = {"args": args, "load_before": _load()}
    started = time.monotonic()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        done = subprocess.run(
            [sys.executable, str(ROOT / "tools" / f"bench_{name}.py"), *args],
            capture_output=True,
            text=True,
            timeout=limit,
            env=env,
            cwd=ROOT,
        )
    except subprocess.TimeoutExpired:
        record["error"] = f"did not finish within {limit:.0f} s"
    else:
        try:  # a benchmark that misses its target exits 1 and still prints its figures
            record["result"] = json.loads(done.stdout)
        except ValueError:
            tail = done.stderr.strip().splitlines()[-3:]
            record["error"] = f"exit code {done.returncode}, no JSON printed: {tail}"
        if done.returncode:
            record["exit_code"] = done.returncode
    record["seconds"] = round(time.monotonic() - started, 1)
    record["load_after"] = _load()
    return record


# -- the summary: issue 26's rows ---------------------------------------------------------------------


def _row(work: str, ratio: float | None, target: float, mine: str, peer: str) -> dict[str, Any]:
    return {
        "work": work,
        "loopd_es": mine,
        "peer": peer,
        "ratio": ratio,
        "target": f">= {target:g}x" if target > 0 else f"<= {-target:g}x",
        "pass": None if ratio is None else (ratio >= target if target > 0 else ratio <= -target),
    }


def _log_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for key, work, target in (
        ("single_append", "SQLite durable single append", 1.1),
        ("batch_100", "SQLite 100-event batches", 1.1),
        ("read_all", "SQLite read_all to envelopes", 3.0),
    ):
        f = r[key]
        rows.append(_row(work, f["ratio"], target, f"{f['loopd_es']:.0f}/s", f"{f['peer']:.0f}/s"))
        if "raw_own_row" in f:  # the limit: plain sqlite3 inserting (or fetching) the very same rows
            verb = "fetching" if key == "read_all" else "writing"
            work = f"{work}: plain sqlite3 {verb} loopd-es's rows (the limit)"
            raw = _row(
                work, f["raw_own_row_over_peer"], target, f"{f['raw_own_row']:.0f}/s", f"{f['peer']:.0f}/s"
            )
            rows.append({**raw, "target": "- (the ceiling of the row above)", "pass": None})
    return rows


def _replay_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    f = r.get("interleaved")
    if f is None:  # without the peer: the figure alone
        return [
            _row("replay of one 10k-event goal", None, 10.0, f"{r['goal_10k']['from_scratch_ms']} ms", "-")
        ]
    goal = f"{f['loopd_es_ms']} ms", f"{f['eventsourcing_ms']} ms"
    rows = [_row("replay of one 10k-event goal", f["ratio"], 10.0, *goal)]
    if r.get("eventsourcing_fleet"):
        mine, peer = r["fleet"], r["eventsourcing_fleet"]
        work = f"replay of {mine['goals']} goals ({mine['events']} events), one pass"
        fleet = f"{mine['rebuild_s']} s", f"{peer['rebuild_s']} s"
        rows.append(_row(work, r["ratio_eventsourcing_over_fleet"], 10.0, *fleet))
    return rows


def _postgres_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for key, f in r["appends"].items():
        batch, procs = key.removeprefix("batch").split("_processes")
        what = "single append" if batch == "1" else f"{batch}-event batches"
        rows.append(
            _row(
                f"PostgreSQL {what}, {procs} process{'es' if procs != '1' else ''}",
                f.get("ratio_over_eventsourcing"),
                1.2,
                f"{f['store_per_s']}/s",
                f"{f['eventsourcing_per_s']}/s" if "eventsourcing_per_s" in f else "-",
            )
        )
    return rows


def _cli_rows(r: dict[str, Any], label: str) -> list[dict[str, Any]]:
    rows = []
    bare = f"{r['python_c_pass_ms']} ms"
    for key, limit in (("help", 2.0), ("read_limit_1", 3.0), ("goals", 3.0), ("history", 3.0)):
        f = r[key]
        work = f"CLI {key.replace('_limit_1', ' --limit 1').replace('help', '--help')} ({label})"
        rows.append(_row(work, f["ratio"], -limit, f"{f['ms']} ms", f"python -c pass {bare}"))
    floor = r.get("query_floor")
    if floor is not None:  # what a query must import before any loopd-es code: no query goes below it
        work = f"floor of a query: {floor['command']} ({label})"
        rows.append({**_row(work, floor["ratio"], -3.0, f"{floor['ms']} ms", f"python -c pass {bare}"),
                     "target": "- (the floor under the 3x)", "pass": None})  # fmt: skip
    return rows


def _turn_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 26 item 2 against a real ``opencode serve``: the turnaround and the engine's own share, each as
    its figure over the target (a limit, not a peer: at most 1x)."""
    got, own = r["turnaround"]["idle_to_prompt_received"], r["turn"]["engine_overhead"]
    work = "OpenCode turn: idle to the next prompt received"
    return [
        _row(f"{work}, p50", round(got["p50_ms"] / 300, 3), -1.0, f"{got['p50_ms']} ms", "300 ms"),
        _row(f"{work}, p99", round(got["p99_ms"] / 1000, 3), -1.0, f"{got['p99_ms']} ms", "1000 ms"),
        _row(
            "OpenCode turn: the engine's own share, p50",
            own["ratio_p50"],
            -1.0,
            f"{own['p50_ms']} ms",
            "10 ms",
        ),
    ]


SUMMARY: dict[str, Callable[[dict[str, Any]], list[dict[str, Any]]]] = {
    "log_sqlite": _log_rows,
    "replay": _replay_rows,
    "postgres": _postgres_rows,
    "cli": lambda r: _cli_rows(r, "editable install"),
    "cli_venv": lambda r: _cli_rows(r, "non-editable install in a venv"),
    "opencode": _turn_rows,
}


def summary(benchmarks: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for name, rows_of in SUMMARY.items():
        result = benchmarks.get(name, {}).get("result")
        if result is not None:
            try:
                rows.extend(rows_of(result))
            except (KeyError, TypeError, ZeroDivisionError) as e:
                rows.append({"work": name, "error": f"unexpected result shape: {e!r}"})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="the issue-26 rows only, smaller")
    parser.add_argument(
        "--only", default="", help="comma-separated benchmark names (default: all of the mode)"
    )
    parser.add_argument(
        "--venv", default=None, metavar="PYTHON", help="also time the CLI of this interpreter's install"
    )
    parser.add_argument("--out", type=Path, default=OUT, help="where the JSON file goes (default docs/bench)")
    args = parser.parse_args(argv)
    plan = dict(QUICK if args.quick else FULL)
    if args.venv:
        cli_args, cli_limit = plan.get("cli", QUICK["cli"])
        plan["cli_venv"] = ([*cli_args, "--python", args.venv], cli_limit)
    if args.only:
        wanted = {n.strip() for n in args.only.split(",") if n.strip()}
        unknown = wanted - set(plan)
        if unknown:
            parser.error(f"unknown benchmark(s) {', '.join(sorted(unknown))}; known: {', '.join(plan)}")
        plan = {k: v for k, v in plan.items() if k in wanted}
    started = datetime.now(UTC)
    record: dict[str, Any] = {
        "started": started.isoformat(timespec="seconds"),
        "mode": "quick" if args.quick else "full",
        "commit": _git("rev-parse", "HEAD"),
        "tree_changed": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "machine": machine(),
        "load_before": _load(),
        "benchmarks": {},
    }
    for name, (bench_args, limit) in plan.items():
        why = _needs(name)
        if why:
            record["benchmarks"][name] = {"skipped": why}
            continue
        script = "cli" if name == "cli_venv" else name
        sys.stderr.write(f"bench_all: {name}...\n")
        record["benchmarks"][name] = run_one(script, bench_args, limit)
        sys.stderr.write(f"bench_all: {name} took {record['benchmarks'][name]['seconds']} s\n")
    record["load_after"] = _load()
    record["seconds"] = round((datetime.now(UTC) - started).total_seconds(), 1)
    record["summary"] = summary(record["benchmarks"])
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    path = args.out / f"{stamp}-{record['commit'][:8]}-{record['mode']}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    for row in record["summary"]:
        ok = {True: "ok", False: "MISS", None: "-"}[row.get("pass")]
        print(f"{row['work']:<60} {row.get('ratio')!s:>7} {row.get('target', ''):>8} {ok}")
    print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
