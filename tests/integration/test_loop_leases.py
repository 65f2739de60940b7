"""Ownership as leases with real processes: a runner killed with SIGKILL stops renewing its lease; the next runner
cancels that owner's ephemeral task (``owner-dead``) and adopts its durable one, which keeps firing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest

from loopd_es.domain.loop.decide import task_id_for
from loopd_es.events import loop as ev
from loopd_es.events.catalogue import decode_payload
from loopd_es.log import open_store
from loopd_es.sched import service
from tests.waits import wait_until

if TYPE_CHECKING:
    from loopd_es.domain.loop.model import Task

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("LOOPD_ES_STORE", None)
    return env


def _loop(tmp: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "loopd_es", "--store", f"sqlite:{tmp / 'ev.db'}", "loop", "--host",
            f"sim:{tmp / 'host.json'}", *args]  # fmt: skip


@dataclass
class State:
    tasks: dict[str, Task]
    adopted: list[ev.TaskAdopted]


async def _tasks(tmp: Path) -> State:
    async with await open_store(f"sqlite:{tmp / 'ev.db'}", create=False) as store:
        s = await service.read_session(store, "s1")
        found = [
            decode_payload(env) async for env in store.read_all() if env.type == ev.TaskAdopted.event_type
        ]
        return State(s.tasks, [e for e in found if isinstance(e, ev.TaskAdopted)])


def _wait(tmp: Path, what: str, check: Callable[[State], bool]) -> State:
    return wait_until(what, lambda: anyio.run(_tasks, tmp), done=check)


@pytest.mark.timeout(120)
def test_a_dead_runners_lease_ends_its_ephemeral_tasks_and_hands_over_its_durable_ones(
    tmp_path: Path,
) -> None:
    (tmp_path / "host.json").write_text(json.dumps({"sessions": [{"id": "s1"}], "auto_reply": True}))
    a = subprocess.Popen(_loop(tmp_path, "run", "--owner", "A", "--ttl-ms", "2000", "--period-ms", "100"),
                         env=_env(), cwd=tmp_path, stdout=subprocess.DEVNULL)  # fmt: skip
    try:
        for name, extra in (("eph", ["--ephemeral"]), ("dur", [])):
            cmd = _loop(tmp_path, "--session", "s1", "--owner", "A", "--message-id", name, *extra, "--ttl-ms", "2000",
                        "add", "1s", "--jitter=false", name)  # fmt: skip
            subprocess.run(cmd, env=_env(), cwd=tmp_path, check=True, capture_output=True)
        eph, dur = task_id_for("eph"), task_id_for("dur")
        fired = _wait(
            tmp_path, "two fires of each task", lambda s: s.tasks[dur].fires >= 2 and s.tasks[eph].fires >= 2
        )
        # three more 1 s fires outlast the 2 s lease, counted rather than timed: A keeps renewing it, so nothing
        # dies while A lives
        later = fired.tasks[dur].fires + 3
        _wait(tmp_path, "three more fires of the durable task", lambda s: s.tasks[dur].fires >= later)
        assert anyio.run(_tasks, tmp_path).tasks[eph].live
    finally:
        a.send_signal(signal.SIGKILL)
        a.wait()
    b = subprocess.Popen(_loop(tmp_path, "run", "--owner", "B", "--period-ms", "100"),
                         env=_env(), cwd=tmp_path, stdout=subprocess.DEVNULL)  # fmt: skip
    try:
        state = _wait(
            tmp_path,
            "B to end the ephemeral task and adopt the durable one",
            lambda s: s.tasks[eph].cancelled == "owner-dead" and bool(s.adopted),
        )
        fires = state.tasks[dur].fires
        assert state.tasks[dur].owner == "B"
        assert [(x.previous_owner, x.owner) for x in state.adopted] == [("A", "B")]
        _wait(tmp_path, "two fires under B", lambda s: s.tasks[dur].fires >= fires + 2)
    finally:
        b.send_signal(signal.SIGTERM)
        assert b.wait(timeout=30) in (0, -signal.SIGTERM)
