"""Races of ``loopd-es run`` played on purpose with held host calls (#21 items 2, 3, 7; #25 item 1).

A hold (``loopd-es host hold CALL``) stops the simulated host's call at its start in whatever process makes
it, until ``loopd-es host release CALL``; ``host held --wait CALL`` returns once one is waiting. So "the
engine is stopped while a /loop prompt is on its way" is a fixed order of steps, not a lucky timing.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest

from loopd_es.domain.loop.decide import task_id_for
from loopd_es.events import loop as ev
from loopd_es.log import open_store
from loopd_es.sched import service
from tests.waits import wait_for_output, wait_until

from .test_loop_leases import _env
from .test_loop_race import _events
from .test_tool_channel import project  # noqa: F401 - the installed project fixture

if TYPE_CHECKING:
    from loopd_es.domain.loop.model import Task

    from .test_tool_channel import Project

pytestmark = pytest.mark.slow
CLAIM_TTL_MS = 5_000


def _cli(tmp: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    base = [sys.executable, "-m", "loopd_es", "--store", f"sqlite:{tmp / 'ev.db'}"]
    return subprocess.run(
        [*base, *args], env=_env(), cwd=tmp, capture_output=True, text=True, timeout=timeout, check=False
    )


async def _task(tmp: Path, message_id: str) -> Task | None:
    async with await open_store(f"sqlite:{tmp / 'ev.db'}", create=False) as store:
        return (await service.read_session(store, "s1")).tasks.get(task_id_for(message_id))


@pytest.mark.timeout(180)
def test_sigterm_during_a_held_loop_prompt_finishes_the_fire_and_exits_0(tmp_path: Path) -> None:
    (tmp_path / "host.json").write_text(json.dumps({"sessions": [{"id": "s1"}], "auto_reply": True}))
    host = ["--host", f"sim:{tmp_path / 'host.json'}"]
    added = _cli(tmp_path, "loop", *host, "--session", "s1", "--message-id", "tick", "add", "2s",
                 "--jitter=false", "tick")  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert _cli(tmp_path, "host", "hold", "prompt", *host).returncode == 0
    err = tmp_path / "run.err"
    with err.open("w") as stderr:
        engine = subprocess.Popen(
            [sys.executable, "-m", "loopd_es", "--store", f"sqlite:{tmp_path / 'ev.db'}", "run", *host,
             "--claim-ttl-ms", str(CLAIM_TTL_MS)],
            env=_env(), cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=stderr, text=True,
        )  # fmt: skip
    try:
        held = _cli(tmp_path, "host", "held", "--wait", "prompt", "--json", *host)
        assert held.returncode == 0, (held.stderr, err.read_text())
        waiting = json.loads(held.stdout)["held"]
        assert [(h["op"], h["session_id"], h["pid"]) for h in waiting] == [("prompt", "s1", engine.pid)]
        engine.send_signal(signal.SIGTERM)
        wait_for_output(err, "SIGTERM: stopping", process=engine)
        assert engine.poll() is None  # the fire in progress holds the stop until it is recorded
        released = _cli(tmp_path, "host", "release", "prompt", *host)
        assert released.returncode == 0 and "1 call(s) go on" in released.stdout, released
        assert engine.wait(timeout=30) == 0, err.read_text()
    finally:
        if engine.poll() is None:
            engine.kill()
            engine.wait()
    assert "Traceback" not in err.read_text() and "internal error" not in err.read_text(), err.read_text()
    task = anyio.run(_task, tmp_path, "tick")
    assert task is not None and task.firing is None  # the fire is closed
    assert (task.fires, task.last_outcome) == (1, "succeeded")
    state = json.loads((tmp_path / "host.state.json").read_text())
    prompts = [p["text"] for p in state["prompts"]]
    assert len(prompts) == 1 and prompts[0].endswith("\n\ntick")  # the prompt went out, once
    # a sweep after the claim's lifetime finds nothing left open: no claimer-lost, now or later
    after = time.time_ns() // 1_000_000 + CLAIM_TTL_MS + 1
    tick = _cli(tmp_path, "loop", *host, "tick", "--all-sessions", "--now", str(after),
                "--claim-ttl-ms", str(CLAIM_TTL_MS))  # fmt: skip
    assert tick.returncode == 0, tick.stderr
    events = anyio.run(_events, tmp_path)
    assert not any(isinstance(e, ev.FireFailed) for e in events), events
    fired_slot = task.recent[0][0]  # the slot the engine fired (earlier ones were missed before it started)
    assert [e.slot for e in events if isinstance(e, ev.FireSucceeded)].count(fired_slot) == 1


@pytest.mark.timeout(240)
def test_a_standby_answers_complete_goal_during_a_takeover(project: Project) -> None:  # noqa: F811
    """The holder is killed with ``kill -9``; the standby takes the lease over, and its first host calls are
    held, so the takeover is in progress when the worker calls ``complete_goal`` over the Unix socket (the
    newest server owns the path). The standby answers it; released, it carries on with the goal complete."""
    project.start_engine()
    assert project.engine is not None
    holder = project.engine
    goal = {"name": "docs", "objective": "write the guide", "checks": ["test -n ok"]}
    created = project.call("loopd_create_goal", goal)
    assert created["ok"] is True, created
    goal_id = created["goalID"]
    worker = _worker(project, goal_id)
    standby_log = project.engine_log.with_name("standby.log")
    with standby_log.open("w") as log:
        standby = subprocess.Popen(
            [sys.executable, "-m", "loopd_es.cli", "run", "--lease-ms", "3000"],
            cwd=project.dir, env=project.env, stdout=subprocess.DEVNULL, stderr=log, text=True,
        )  # fmt: skip
    try:
        wait_for_output(standby_log, "serving the OpenCode tools", process=standby)
        wait_for_output(standby_log, "standing by", process=standby)
        assert project.cli("host", "hold", "session_status", "messages").returncode == 0
        holder.kill()  # kill -9
        holder.wait()
        wait_for_output(
            standby_log, "engine running", process=standby, within=60
        )  # the standby took the lease
        _wait_until_held_by(project, standby.pid)  # ... and its takeover is stopped at a host call
        context = {"sessionID": worker, "messageID": "msg_done", "callID": "call_done", "agent": "build"}
        args = {"summary": "the guide is written", "evidence": "docs/guide.md"}
        done = subprocess.run(
            [str(project.bun), "run", "call.ts", "complete_goal", json.dumps(args), json.dumps(context)],
            cwd=project.dir, env={**project.env, "BUN_BE_BUN": "1"}, capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        assert answer["ok"] is True and answer["status"] == "complete", answer
        released = project.cli("host", "release")
        assert released.returncode == 0, released.stderr
        shown = project.cli("goal", "show", goal_id, "--json")
        assert json.loads(shown.stdout)["goal"]["status"] == "complete", shown.stdout
        assert standby.poll() is None, standby_log.read_text()  # carries on after the takeover
    finally:
        project.cli("host", "release")
        if standby.poll() is None:
            standby.send_signal(signal.SIGTERM)
            assert standby.wait(timeout=30) == 0, standby_log.read_text()
    assert "Traceback" not in standby_log.read_text(), standby_log.read_text()


def _worker(proj: Project, goal_id: str) -> str:
    """The goal's worker session, once the engine has made it."""

    def shown() -> dict[str, object]:
        out = proj.cli("goal", "show", goal_id, "--json")
        assert out.returncode == 0, out.stderr
        goal: dict[str, object] = json.loads(out.stdout)["goal"]
        return goal

    goal = wait_until("the goal's worker session", shown, done=lambda g: bool(g.get("worker_session_id")))
    return str(goal["worker_session_id"])


def _wait_until_held_by(proj: Project, pid: int, within: float = 60) -> None:
    """Return once a host call of process ``pid`` waits at a hold (a killed process's calls stay listed)."""

    def held() -> list[dict[str, object]]:
        out = proj.cli("host", "held", "--json")
        assert out.returncode == 0, out.stderr
        calls: list[dict[str, object]] = json.loads(out.stdout)["held"]
        return calls

    wait_until(
        f"a host call of process {pid} at a hold",
        held,
        done=lambda calls: any(h["pid"] == pid for h in calls),
        within=within,
    )
