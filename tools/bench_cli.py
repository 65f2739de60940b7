"""CLI start-up: ``--help`` and one-shot queries against ``python -c pass``, measured in the same run.

    python tools/bench_cli.py                                   # this interpreter (an editable install)
    python tools/bench_cli.py --python /tmp/venv/bin/python     # a non-editable install in a venv

Prints one JSON document. Setup (not timed): ``loopd-es demo`` writes a small log with goals and their read
models. Then, in rounds whose order rotates, each command runs as a child process of ``--python`` (its
``loopd-es`` console script when it has one beside it, else ``-m loopd_es``), beside ``python -c pass`` of
the same interpreter; the figure is the median of the per-round ratios (target from issue 26: ``--help``
<= 2x, a query <= 3x). ``query_floor`` times ``python -c "import msgspec, sqlite3"`` in the same rounds: what
every query must load before any loopd-es code runs (envelopes are msgspec structs), so no query can be
faster than that ratio. Children may write bytecode caches (an installed package has them), and each
command runs once before the rounds so that they exist.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

COMMANDS = {
    "help": (["--help"], 2.0),
    "read_limit_1": (["read", "--limit", "1"], 3.0),
    "goals": (["goals"], 3.0),
    "history": (["history", "{goal}"], 3.0),
}

FLOOR = "query_floor"


def _wall(cmd: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env=env, cwd=tempfile.gettempdir())
    return (time.perf_counter() - started) * 1000


def import_profile(cmd: list[str], env: dict[str, str], top: int = 8) -> dict[str, Any]:
    """Where a command's start-up goes: ``PYTHONPROFILEIMPORTTIME`` of one run, the top-level imports
    (their cumulative ms) that cost the most, and the sum of all top-level imports."""
    done = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        env={**env, "PYTHONPROFILEIMPORTTIME": "1"},
        cwd=tempfile.gettempdir(),
        check=True,
    )
    roots: dict[str, float] = {}
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = line.removeprefix("import time:").split("|")
        if not name.startswith(" ") or name.startswith("  ") or not cumulative.strip().isdigit():
            continue  # only top-level imports (one space before the name)
        roots[name.strip()] = roots.get(name.strip(), 0.0) + int(cumulative) / 1000
    costly = sorted(roots.items(), key=lambda kv: -kv[1])[:top]
    return {
        "imports_ms": round(sum(roots.values()), 1),
        "top_level": {name: round(ms, 1) for name, ms in costly},
    }


def _entry(python: str) -> list[str]:
    script = Path(python).parent / "loopd-es"
    return [str(script)] if script.exists() else [python, "-m", "loopd_es"]


def run(args: argparse.Namespace) -> dict[str, Any]:
    python = args.python or sys.executable
    # another interpreter's install is measured as installed: not through this checkout on PYTHONPATH
    dropped = {"PYTHONDONTWRITEBYTECODE", *(["PYTHONPATH"] if args.python else [])}
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    base = Path(tempfile.mkdtemp(prefix="bench-cli-"))
    entry = _entry(python)
    try:
        demo = base / "demo"
        subprocess.run(
            [*entry, "demo", "--dir", str(demo)], check=True, capture_output=True, env=env, cwd=base
        )
        store = ["--store", f"sqlite:{demo / 'events.db'}"]
        listed = subprocess.run(
            [*entry, *store, "goals", "--json"], check=True, capture_output=True, env=env, text=True, cwd=base
        )
        goal = json.loads(listed.stdout)["goals"][0]["goal_id"]
        cmds = {
            name: [*entry, *([] if name == "help" else store), *(a.format(goal=goal) for a in argv)]
            for name, (argv, _) in COMMANDS.items()
        }
        bare = [python, "-c", "pass"]
        cmds[FLOOR] = [python, "-c", "import msgspec, sqlite3"]
        for cmd in [bare, *cmds.values()]:  # bytecode caches and the read models' catch-up
            _wall(cmd, env)
        times: dict[str, list[float]] = {"bare": [], **{name: [] for name in cmds}}
        order = ["bare", *cmds]
        for r in range(args.rounds):
            k = r % len(order)
            for name in order[k:] + order[:k]:
                times[name].append(_wall(bare if name == "bare" else cmds[name], env))
        where = subprocess.run(
            [python, "-c", "import loopd_es; print(loopd_es.__file__)"],
            check=True, capture_output=True, env=env, text=True, cwd=base,
        )  # fmt: skip
        out: dict[str, Any] = {
            "python": python,
            "loopd_es_from": where.stdout.strip(),
            "entry": entry,
            "python_c_pass_ms": round(statistics.median(times["bare"]), 1),
        }
        out["import_profile"] = {
            "python_c_pass": import_profile(bare, env),
            "help": import_profile(cmds["help"], env),
            "read_limit_1": import_profile(cmds["read_limit_1"], env),
        }
        floor = statistics.median(m / b for m, b in zip(times[FLOOR], times["bare"], strict=True))
        out[FLOOR] = {
            "command": 'python -c "import msgspec, sqlite3"',
            "ms": round(statistics.median(times[FLOOR]), 1),
            "ratio": round(floor, 2),
        }
        for name, (_, limit) in COMMANDS.items():
            ratio = statistics.median(m / b for m, b in zip(times[name], times["bare"], strict=True))
            out[name] = {
                "ms": round(statistics.median(times[name]), 1),
                "ratio": round(ratio, 2),
                "target": f"<= {limit:g}x python -c pass",
                "pass": ratio <= limit,
            }
        return out
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--python", default=None, help="the interpreter whose loopd-es to time")
    parser.add_argument("--rounds", type=int, default=15, help="rounds; medians of per-round ratios")
    print(json.dumps(run(parser.parse_args(argv)), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
