"""What a running engine repairs by itself, and what it leaves to the machine that owns it.

- A command whose owner was killed is marked ``missing`` when the engine starts (no ``cmd reconcile`` typed).
- A switch whose process was killed mid host call is settled by maintenance, to the host's live identity.
- On one PostgreSQL log used from two machines (two state directories), machine B neither marks machine A's
  live command missing nor fires its awaits; it shows it as running elsewhere.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from loopd_es.domain.evolve import fold, initial
from loopd_es.domain.streams import goal_stream
from loopd_es.host.simulated import SimulatedHost
from loopd_es.log import open_store
from tests.waits import wait_until

from ..postgres_server import pg_url

pytestmark = pytest.mark.slow
__all__ = ["pg_url"]

SCRIPT = {"models": [{"provider": "openai", "id": "gpt-5"}, {"provider": "openai", "id": "gpt-5-mini"}],
          "agents": [{"name": "build"}, {"name": "plan"}]}  # fmt: skip


def _env(workdir: Path, store: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPD_ES_CRASH")}
    env.update(LOOPD_ES_STORE=store, LOOPD_ES_HOST=f"sim:{workdir / 'host.json'}", **extra)
    return env


def _cli(workdir: Path, store: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loopd_es", *args],
        cwd=workdir, env=_env(workdir, store, **env), capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def _engine(workdir: Path, store: str) -> subprocess.Popen[str]:
    with (workdir / "engine.err").open("w") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "loopd_es", "run", "--holder", "e", "--maintenance-ms", "300",
             "--lease-ms", "2000"],
            cwd=workdir, env=_env(workdir, store), stdout=subprocess.DEVNULL, stderr=err, text=True,
        )  # fmt: skip


def _stop(engine: subprocess.Popen[str], workdir: Path) -> None:
    engine.send_signal(signal.SIGTERM)
    assert engine.wait(timeout=30) == 0, (workdir / "engine.err").read_text()


def _command(workdir: Path, store: str, command_id: str, **env: str) -> dict[str, object]:
    shown = _cli(workdir, store, "cmd", "show", command_id, **env)
    assert shown.returncode == 0, shown.stderr
    found: dict[str, object] = json.loads(shown.stdout)
    return found


def test_the_engine_marks_a_command_whose_owner_died_missing_when_it_starts(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'events.db'}"
    (tmp_path / "host.json").write_text(json.dumps(SCRIPT))
    started = _cli(tmp_path, url, "cmd", "start", "--", "sleep", "300")
    assert started.returncode == 0, started.stderr
    command_id = started.stdout.strip()
    wait_until("the spawn", lambda: _command(tmp_path, url, command_id).get("supervisor_pid"))
    record = _command(tmp_path, url, command_id)
    os.kill(int(str(record["supervisor_pid"])), signal.SIGKILL)  # the owner dies; nobody types reconcile
    os.kill(int(str(record["pid"])), signal.SIGKILL)
    assert _command(tmp_path, url, command_id)["status"] == "running"
    engine = _engine(tmp_path, url)
    try:
        wait_until(
            "the engine to reconcile", lambda: _command(tmp_path, url, command_id)["status"] == "missing"
        )
    finally:
        _stop(engine, tmp_path)
    assert "marked 1 command(s) whose owner is gone as missing" in (tmp_path / "engine.err").read_text()


def test_maintenance_settles_a_switch_whose_process_was_killed_mid_host_call(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'events.db'}"
    (tmp_path / "host.json").write_text(json.dumps(SCRIPT))
    created = _cli(tmp_path, url, "goal", "create", "g", "--objective", "o", "--model", "openai/gpt-5",
                   "--agent", "build", "--interactive", "--read-only")  # fmt: skip
    assert created.returncode == 0, created.stderr
    goal_id = created.stdout.splitlines()[0]
    assert _cli(tmp_path, url, "sim", "reply", goal_id).returncode == 0  # the worker answers the first turn
    assert _cli(tmp_path, url, "goal", "idle", goal_id).returncode == 0
    trace = tmp_path / "trace.txt"
    switch = ("goal", "switch-identity", goal_id, "--model", "openai/gpt-5-mini", "--agent", "plan")
    probe = tmp_path.parent / f"{tmp_path.name}-probe"
    shutil.copytree(tmp_path, probe)  # find the crash point just after the first host call, on a copy
    probed = _cli(probe, f"sqlite:{probe / 'events.db'}", *switch, LOOPD_ES_CRASH_TRACE=str(trace))
    assert probed.returncode == 0, probed.stderr
    points = trace.read_text().splitlines()
    k = next(i for i, p in enumerate(points, 1) if "after host forward switch_model" in p)
    killed = _cli(tmp_path, url, *switch, LOOPD_ES_CRASH_AT=str(k))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert anyio.run(_state, url, goal_id).switch_in_flight is not None
    engine = _engine(tmp_path, url)
    try:
        wait_until("maintenance to settle the switch",
                 lambda: anyio.run(_state, url, goal_id).switch_in_flight is None)  # fmt: skip
    finally:
        _stop(engine, tmp_path)
    state = anyio.run(_state, url, goal_id)
    live = anyio.run(
        SimulatedHost.from_file(tmp_path / "host.json").session_identity, state.worker_session_id
    )
    assert (state.config.model, state.config.agent) == (live.model, live.agent)


async def _state(url: str, goal_id: str):  # type: ignore[no-untyped-def]
    async with await open_store(url) as store:
        return fold([e async for e in store.read_stream(goal_stream(goal_id))], initial(goal_id))


def test_a_command_belongs_to_the_machine_that_runs_it(tmp_path: Path, pg_url: str) -> None:
    (tmp_path / "host.json").write_text(json.dumps(SCRIPT))
    machine_a = {"XDG_STATE_HOME": str(tmp_path / "state-a")}
    machine_b = {"XDG_STATE_HOME": str(tmp_path / "state-b")}
    started = _cli(tmp_path, pg_url, "cmd", "start", "--", "sleep", "300", **machine_a)
    assert started.returncode == 0, started.stderr
    command_id = started.stdout.strip()
    try:
        wait_until("the spawn", lambda: _command(tmp_path, pg_url, command_id, **machine_a).get("pid"))
        reconciled = _cli(tmp_path, pg_url, "cmd", "reconcile", **machine_b)
        assert reconciled.returncode == 0, reconciled.stderr
        on_b = _command(tmp_path, pg_url, command_id, **machine_b)
        assert on_b["status"] == "running" and on_b["runs_here"] is False, on_b
        listed = _cli(tmp_path, pg_url, "cmd", "list", **machine_b)
        assert "(on machine " in listed.stdout, listed.stdout
        on_a = _command(tmp_path, pg_url, command_id, **machine_a)
        assert on_a["runs_here"] is True and on_a["machine"] == on_b["machine"]
        assert _cli(tmp_path, pg_url, "cmd", "reconcile", **machine_a).returncode == 0
        assert _command(tmp_path, pg_url, command_id, **machine_a)["status"] == "running", (
            "its owner is alive"
        )
    finally:
        _cli(tmp_path, pg_url, "cmd", "kill", command_id, **machine_a)
