"""A stand-in for a running opencode-loopd: writes a project's ``state.json`` and ``events.ndjson`` over time.

``python -m loopd_es.testing.loopd_project DIR [--goals N] [--pace S] [--rotate-at L] [--torn-at L]``

Each step is one loopd mutation, written the way loopd writes it (docs/reference/loopd.md#s4-1, #s4-3):
``state.json``
first, atomically (a ``.tmp-*`` file renamed over it, revision + 1), then the ledger line, appended with
no lock. Goals are started, run turns that report progress, are paused and resumed, and complete, in
round-robin. ``--rotate-at L`` renames the ledger to ``events.ndjson.1`` (older segments move up one)
after line L, as ``logrotate`` would; ``--torn-at L`` writes line L in two halves with a pause between, so
a reader can see a torn tail. After each complete line it prints ``{"line": L, "at": UNIX_TIME}``, and
``{"done": LINES}`` at the end. ``--hold-at L`` stops after line L (in its middle when L is the torn line),
prints ``{"held": L, "whole": W}`` (W: the last complete line) and goes on when a line arrives on stdin, so a
test can act (kill a mirror) at a point it chose rather than at a time. Used by the mirror tests and
``tools/bench_mirror.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..clock import SystemClock, iso

CYCLE = (
    "create",
    "run",
    "progress",
    "done",
    "run",
    "progress",
    "done",
    "pause",
    "resume",
    "run",
    "complete",
)
"""The steps of one goal's life, in order."""


class Project:
    """The project's files and the state loopd would hold in memory."""

    def __init__(self, directory: Path, torn_at: int, rotate_at: int, pace: float, hold_at: int = 0) -> None:
        self.base = directory / ".opencode" / "loopd"
        self.base.mkdir(parents=True, exist_ok=True)
        self.state: dict[str, Any] = {
            "version": 9,
            "revision": 0,
            "goals": [],
            "runtimes": [],
            "commandLedger": [],
            "commands": [],
        }
        self.lines = 0
        self.torn_at, self.rotate_at, self.pace, self.hold_at = torn_at, rotate_at, pace, hold_at
        self.echo = True
        """Print each line's number and time (the benchmark's clock); off for in-process tests."""

    def write_state(self) -> None:
        """loopd's ``writeAtomic``: a temporary file renamed over ``state.json``."""
        self.state["revision"] += 1
        tmp = self.base / f".tmp-{os.getpid()}-{time.time_ns()}"
        tmp.write_text(json.dumps(self.state, indent=2))
        os.replace(tmp, self.base / "state.json")

    def append(self, line: dict[str, Any]) -> None:
        """loopd's ``appendEvent`` (after the state write), then rotation if this was the line to rotate at."""
        self.lines += 1
        data = (json.dumps(line) + "\n").encode()
        ledger = self.base / "events.ndjson"
        with ledger.open("ab") as f:
            if self.lines == self.torn_at:
                f.write(data[: len(data) // 2])
                f.flush()
                if self.hold_at == self.lines:
                    self.hold(self.lines - 1)
                else:
                    time.sleep(max(self.pace * 4, 0.2))  # the torn tail stays visible a while
                f.write(data[len(data) // 2 :])
            else:
                f.write(data)
        if self.echo:
            _say({"line": self.lines, "at": time.time()})
        if self.lines == self.rotate_at:
            _rotate(ledger)
        if self.lines == self.hold_at != self.torn_at:
            self.hold(self.lines)

    def hold(self, whole: int) -> None:
        """Say where the writer stopped and wait for a line on stdin (``--hold-at``)."""
        _say({"held": self.lines, "whole": whole})
        sys.stdin.readline()

    def step(self, goal_index: int, action: str) -> None:
        """One mutation: the state write, then (a moment later, as loopd) its ledger line."""
        line = self.prepare(goal_index, action)
        time.sleep(0.002)
        self.append(line)

    def prepare(self, goal_index: int, action: str) -> dict[str, Any]:
        """Apply ``action`` to the state and write it; returns the ledger line still to append."""
        gid = f"70000000-0000-4000-8000-{goal_index:012d}"
        now = iso(SystemClock().now())
        base = {"version": 1, "eventID": f"e{self.lines + 1:07d}", "goalID": gid, "timestamp": now}
        if action == "create":
            self.state["goals"].append(
                {
                    "id": gid,
                    "name": f"goal {goal_index}",
                    "objective": f"objective {goal_index}",
                    "status": "active",
                    "ownerSessionID": "ses_owner",
                    "workerSessionID": f"ses_worker{goal_index}",
                    "config": {"model": "prov/model-a", "agent": "build"},
                    "tokensUsed": 0,
                    "timeUsedSeconds": 0,
                    "createdAt": now,
                    "updatedAt": now,
                }
            )
            self.state["runtimes"].append(
                {"goalID": gid, "phase": "idle", "runCount": 0, "budgetTurnCount": 0, "updatedAt": now}
            )
        goal = next(g for g in self.state["goals"] if g["id"] == gid)
        rt = next(r for r in self.state["runtimes"] if r["goalID"] == gid)
        goal["updatedAt"] = rt["updatedAt"] = now
        base["revision"] = self.state["revision"] + 1
        extra: dict[str, Any]
        if action == "create":
            extra = {"type": "goal.created", "name": goal["name"], "objective": goal["objective"]}
            extra["ownerSessionID"] = "ses_owner"
        elif action == "run":
            rt["runCount"] += 1
            rt["budgetTurnCount"] += 1
            rt["runGeneration"] = rt.get("runGeneration", 0) + 1
            rt["phase"], rt["activeRunID"] = "running", f"run-{goal_index}-{rt['runCount']}"
            extra = {"type": "run.started", "runID": rt["activeRunID"], "turnCount": rt["runCount"]}
        elif action == "progress":
            summary, nxt = f"step {rt['runCount']} of goal {goal_index}", "the next step"
            goal["lastProgress"] = {"summary": summary, "next": nxt, "at": now}
            extra = {"type": "goal.progress", "summary": summary, "next": nxt}
        elif action == "done":
            run_id = rt.pop("activeRunID")
            rt["phase"] = "idle"
            goal["tokensUsed"] += 100
            extra = {"type": "run.completed", "runID": run_id}
        elif action in ("pause", "resume"):
            before, goal["status"] = goal["status"], "paused" if action == "pause" else "active"
            extra = {"type": "goal.status_changed", "from": before, "to": goal["status"]}
        else:
            rt.pop("activeRunID", None)
            rt["phase"] = "idle"
            goal["status"] = "complete"
            goal["completionEvidence"] = {"summary": "all done", "evidence": "tests pass", "at": now}
            extra = {"type": "goal.completed", "summary": "all done", "evidence": "tests pass"}
        self.write_state()
        return {**base, **extra}


def _rotate(ledger: Path) -> None:
    """``logrotate`` without copytruncate: ``.N`` -> ``.N+1`` (oldest first), then the ledger -> ``.1``."""
    numbers = sorted(
        (int(p.name.rsplit(".", 1)[1]) for p in ledger.parent.glob(ledger.name + ".*")), reverse=True
    )
    for n in numbers:
        os.replace(ledger.with_name(f"{ledger.name}.{n}"), ledger.with_name(f"{ledger.name}.{n + 1}"))
    os.replace(ledger, ledger.with_name(ledger.name + ".1"))


def empty_project(directory: Path) -> None:
    """A project loopd has just initialised: ``state.json`` with no goals, no ledger yet."""
    (directory / ".opencode" / "loopd").mkdir(parents=True)
    (directory / ".opencode" / "loopd" / "state.json").write_text('{"version": 9, "goals": []}')


def start_mirror(url: str, directory: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    """``loopd-es mirror-loopd DIR --follow --json`` in a child process, its stdout a text pipe."""
    argv = ["-m", "loopd_es", "--store", url, "mirror-loopd", str(directory), "--follow", "--json"]
    return subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, text=True, env=env)


def _say(doc: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    """Write the project step by step; each goal starts one step after the one before it."""
    p = argparse.ArgumentParser(prog="loopd_project")
    p.add_argument("directory", type=Path)
    p.add_argument("--goals", type=int, default=3)
    p.add_argument("--pace", type=float, default=0.02, help="seconds between steps")
    p.add_argument("--rotate-at", type=int, default=0)
    p.add_argument("--torn-at", type=int, default=0)
    p.add_argument("--cycles", type=int, default=1, help="goal lives in sequence, each with new goals")
    p.add_argument("--hold-at", type=int, default=0, help="after this line, wait for a line on stdin")
    args = p.parse_args(argv)
    project = Project(args.directory, args.torn_at, args.rotate_at, args.pace, args.hold_at)
    for cycle in range(args.cycles):
        goals = range(cycle * args.goals, (cycle + 1) * args.goals)
        for tick in range(len(CYCLE) + args.goals - 1):
            for offset, goal in enumerate(goals):
                if 0 <= tick - offset < len(CYCLE):
                    project.step(goal, CYCLE[tick - offset])
                    time.sleep(args.pace)
    _say({"done": project.lines})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
