"""Follow mode for real: watchfiles on the log, appends made by another process, a bounded lag, a clean stop.

The poll interval is set far beyond the bounds asserted here, so only real file events can pass these
tests; the appender prints ``time.monotonic()`` when each append is acknowledged (CLOCK_MONOTONIC is
shared by every process on Linux), and the projector's commit hook records when each row became visible.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import anyio
import pytest

from loopd_es.log import open_store
from loopd_es.projector import BatchResult, Projector, default_read_db
from projections import StreamStats
from tests.unit.test_projector_base import BACKENDS, Recorder, checkpoints, dump, fill, url_for
from tests.waits import await_until, wait_until

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
APPENDS = 40
POLL = 30.0
"""The follower's safety-net poll (seconds): every bound on a lag is a fraction of it."""
APPENDER = textwrap.dedent(
    """
    import json, sys, time, anyio
    from loopd_es.events.envelope import NewEvent
    from loopd_es.log import open_store

    async def main(url, count, gap):
        async with await open_store(url) as store:
            for i in range(count):
                await anyio.sleep(gap)
                (env,) = await store.append(f"live-{i % 3}", [NewEvent(type="test.live", data={"i": i})])
                print(json.dumps({"position": env.position, "ack": time.monotonic()}), flush=True)

    anyio.run(main, sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
    """
)


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("LOOPD_ES_STORE", None)
    return env


@pytest.mark.parametrize("backend", BACKENDS)
async def test_follow_sees_another_process_append_within_a_bounded_lag(backend: str, tmp_path: Path) -> None:
    url = url_for(backend, tmp_path)
    read_db = tmp_path / "read.db"
    visible: dict[int, float] = {}  # checkpoint reached -> when its commit returned

    def committed(result: BatchResult, at: float) -> None:
        visible.setdefault(result.low, at)

    async with await open_store(url) as store:
        await fill(store, 500)  # history, then live: no seam between them
        async with await Projector.open(store, [Recorder(), StreamStats()], read_db) as projector:
            projector.on_commit = committed
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: projector.follow(poll_interval=POLL))
                await await_until(
                    "the history to be projected", lambda: checkpoints(read_db)["recorder"] >= 500
                )
                appender = await anyio.run_process(
                    [sys.executable, "-c", APPENDER, url, str(APPENDS), "0.02"], env=_env(), cwd=tmp_path
                )
                await await_until(
                    "the appends to be projected before the poll",
                    lambda: checkpoints(read_db)["recorder"] >= 500 + APPENDS,
                    within=POLL / 3,
                )
                cancelled_at = time.monotonic()
                tg.cancel_scope.cancel()
            stopped_in = time.monotonic() - cancelled_at

    acks = [json.loads(line) for line in appender.stdout.decode().splitlines()]
    assert [a["position"] for a in acks] == list(range(501, 501 + APPENDS))
    lags = []
    for ack in acks:
        seen = min(at for low, at in visible.items() if low >= ack["position"])
        lags.append(max(seen - ack["ack"], 0.0))
    # The poll is 30 s away: a lag well under it came from the file event. Bounds relative to the poll, not
    # figures a loaded machine breaks (the lags are ~10 ms on an idle one).
    assert max(lags) < POLL / 3, f"lags {sorted(lags)[-5:]}"
    assert stopped_in < POLL / 3
    rows = dump(read_db)
    assert rows["parked"] == [] and [r[0] for r in rows["recorder"]] == list(range(1, 501 + APPENDS))


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_cli_follows_and_stops_cleanly_on_sigterm(backend: str, tmp_path: Path) -> None:
    url = url_for(backend, tmp_path)
    runner = "import sys\nfrom loopd_es.cli.main import main\nraise SystemExit(main(*sys.argv[1:]))\n"

    async def seed() -> None:
        async with await open_store(url) as store:
            await fill(store, 10)

    anyio.run(seed)
    with subprocess.Popen(
        [sys.executable, "-c", runner, "--store", url, "project", "--follow", "--poll", str(int(POLL))],
        env=_env(),
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    ) as follower:
        try:
            assert follower.stderr is not None
            assert "following" in follower.stderr.readline()
            subprocess.run(
                [sys.executable, "-c", APPENDER, url, "3", "0.01"],
                env=_env(),
                cwd=tmp_path,
                check=True,
                stdout=subprocess.DEVNULL,
            )
            wait_until(
                "the follower to pick up the appends before its poll",
                lambda: checkpoints(tmp_path / default_read_db(url)).get("stream_stats", 0) >= 13,
                within=POLL / 3,
            )
            started = time.monotonic()
            follower.send_signal(signal.SIGTERM)
            assert follower.wait(timeout=POLL) == 0
            assert time.monotonic() - started < POLL / 3  # it did not wait for its next poll to stop
        finally:
            if follower.poll() is None:
                follower.kill()
