"""`loopd-es run` fires scheduled loops itself: a /loop task added from another process fires on its grid."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from loopd_es.domain.loop.decide import task_id_for
from loopd_es.log import open_store
from loopd_es.sched import service
from tests.waits import wait_until

from .test_loop_leases import _env


async def _fires(tmp: Path) -> int:
    async with await open_store(f"sqlite:{tmp / 'ev.db'}", create=False) as store:
        s = await service.read_session(store, "s1")
        task = s.tasks.get(task_id_for("tick"))
        return task.fires if task is not None else 0


@pytest.mark.timeout(120)
def test_the_engine_fires_due_loop_slots(tmp_path: Path) -> None:
    (tmp_path / "host.json").write_text(json.dumps({"sessions": [{"id": "s1"}], "auto_reply": True}))
    base = [sys.executable, "-m", "loopd_es", "--store", f"sqlite:{tmp_path / 'ev.db'}"]
    host = ["--host", f"sim:{tmp_path / 'host.json'}"]
    add = [
        *base,
        "loop",
        *host,
        "--session",
        "s1",
        "--message-id",
        "tick",
        "add",
        "1s",
        "--jitter=false",
        "tick",
    ]
    subprocess.run(add, env=_env(), cwd=tmp_path, check=True, capture_output=True)
    engine = subprocess.Popen(
        [*base, "run", *host], env=_env(), cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        # no `loop run` anywhere: only the engine fires them
        wait_until(
            "the engine to fire three of the loop's slots",
            lambda: anyio.run(_fires, tmp_path),
            done=lambda n: n >= 3,
            within=60,
        )
    finally:
        engine.send_signal(signal.SIGTERM)
        assert engine.wait(timeout=30) == 0
