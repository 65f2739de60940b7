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

from .test_loop_leases import _env
from .test_loop_race import _events

if TYPE_CHECKING:
    from loopd_es.domain.loop.model import Task

pytestmark = pytest.mark.slow
CLAIM_TTL_MS = 5_000


def _cli(tmp: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    base = [sys.executable, "-m", "loopd_es", "--store", f"sqlite:{tmp / 'ev.db'}"]
    return subprocess.run(
        [*base, *args], env=_env(), cwd=tmp, capture_output=True, text=True, timeout=timeout, check=False
    )


def _wait_for_line(path: Path, text: str, within: float = 30) -> None:
    """Return once the file ``path`` (an engine's stderr) contains ``text``."""
    deadline = time.monotonic() + within
    while text not in path.read_text():
        assert time.monotonic() < deadline, f"{text!r} not said: {path.read_text()}"
        time.sleep(0.05)


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
        _wait_for_line(err, "SIGTERM: stopping")
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
    assert task is not None and task.claim is None  # the claim is closed
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
    assert [e.slot for e in events if isinstance(e, ev.FireSucceeded)].count(1) == 1
