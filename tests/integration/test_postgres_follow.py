"""The projector follows a PostgreSQL log woken by LISTEN/NOTIFY: appends from another process, bounded lag.

The poll interval is 30 s, so only notifications can pass: the appender prints ``time.monotonic()`` when each
append is acknowledged, and the projector's commit hook records when each row became visible.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import anyio
import pytest

from loopd_es.log import open_store
from loopd_es.projector import BatchResult, Projector
from projections import StreamStats
from tests.integration.test_projector_follow import APPENDER, _env
from tests.unit.test_projector_base import Recorder, checkpoints, dump, fill
from tests.waits import await_until

from ..postgres_server import pg_url

pytestmark = pytest.mark.anyio
__all__ = ["pg_url"]
APPENDS = 40
POLL = 30.0
"""The follower's safety-net poll (seconds): every bound on a lag is a fraction of it."""


async def test_follow_wakes_on_notify_from_another_process(pg_url: str, tmp_path: Path) -> None:
    read_db = tmp_path / "read.db"
    visible: dict[int, float] = {}

    def committed(result: BatchResult, at: float) -> None:
        visible.setdefault(result.low, at)

    async with await open_store(pg_url) as store:
        await fill(store, 200)
        async with await Projector.open(store, [Recorder(), StreamStats()], read_db) as projector:
            projector.on_commit = committed
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: projector.follow(poll_interval=POLL))
                await await_until(
                    "the history to be projected", lambda: checkpoints(read_db)["recorder"] >= 200
                )
                appender = await anyio.run_process(
                    [sys.executable, "-c", APPENDER, pg_url, str(APPENDS), "0.02"], env=_env(), cwd=tmp_path
                )
                await await_until(
                    "the appends to be projected before the poll",
                    lambda: checkpoints(read_db)["recorder"] >= 200 + APPENDS,
                    within=POLL / 3,
                )
                cancelled_at = time.monotonic()
                tg.cancel_scope.cancel()
            stopped_in = time.monotonic() - cancelled_at

    acks = [json.loads(line) for line in appender.stdout.decode().splitlines()]
    assert [a["position"] for a in acks] == list(range(201, 201 + APPENDS))
    lags = [max(min(at for low, at in visible.items() if low >= a["position"]) - a["ack"], 0.0) for a in acks]
    # The poll is 30 s away: a lag well under it came from the notification. Bounds relative to the poll, not
    # figures a loaded machine breaks (the lags are ~10 ms on an idle one).
    assert max(lags) < POLL / 3, f"lags {sorted(lags)[-5:]}"
    assert stopped_in < POLL / 3
    rows = dump(read_db)
    assert rows["parked"] == [] and [r[0] for r in rows["recorder"]] == list(range(1, 201 + APPENDS))
