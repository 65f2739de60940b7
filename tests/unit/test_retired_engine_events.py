"""Engine coordination lives beside the log, never in it: the lease, membership, claim and fence records that logs
written before 0.4 hold are no event type any more. Such a log still reads, replays and verifies (nothing folds
the ``engine-*`` streams, so their payloads are never decoded), and nothing can append one again."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio
import msgspec
import pytest

from loopd_es.domain.reducers import Folded, LogFold
from loopd_es.errors import InvalidEventError
from loopd_es.events import goal as g
from loopd_es.events.base import CATALOGUE
from loopd_es.events.catalogue import new_event, validate
from loopd_es.events.envelope import NewEvent
from loopd_es.log import open_store

RETIRED = ("engine.lease_acquired", "engine.lease_renewed", "engine.fenced", "engine.member_joined",
           "engine.goal_claimed", "engine.goal_fenced")  # fmt: skip
OLD = {"holder": "e1", "token": 1, "expires_at": "2026-01-01T00:00:02.000Z", "at": "2026-01-01T00:00:00.000Z"}


def test_no_coordination_record_is_an_event_type() -> None:
    assert not [t for t in CATALOGUE if t in RETIRED], "coordination belongs beside the log (log/coord.py)"
    for type_ in RETIRED:
        with pytest.raises(InvalidEventError, match="unknown event type"):
            validate(type_, msgspec.json.encode(OLD))


async def _old_log(url: str) -> dict[str, Folded]:
    async with await open_store(url) as store:  # what an engine of 0.3 wrote beside a goal
        await store.append("engine-lease", [NewEvent(type="engine.lease_acquired", data=OLD)], "any")
        await store.append("goal-g1", [new_event(g.GoalCreated(goal_id="g1", name="g", objective="o",
                                                               owner_session_id="s1"))], "any")  # fmt: skip
        await store.append("engine-goal-g1", [NewEvent(type="engine.goal_fenced", data=OLD)], "any")
        fold = LogFold()
        fold.feed([env async for env in store.read_all()])
        return fold.result()


def test_a_log_from_before_0_4_still_reads_replays_and_verifies(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'events.db'}"
    states = anyio.run(_old_log, url)
    assert states["goal-g1"].state.exists and states["goal-g1"].state.anomaly_count == 0
    assert (
        states["engine-lease"].kind != "goal" and states["engine-goal-g1"].folded == 1
    )  # counted, not decoded
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    for args in (["verify"], ["replay"], ["read", "--stream", "engine-lease"]):
        done = subprocess.run([sys.executable, "-m", "loopd_es", "--store", url, *args], capture_output=True,
                              text=True, env=env, timeout=60)  # fmt: skip
        assert done.returncode == 0, (args, done.stdout, done.stderr)
    appended = subprocess.run(
        [sys.executable, "-m", "loopd_es", "--store", url, "append", "--stream", "engine-lease",
         "--type", "engine.lease_renewed", "--data", msgspec.json.encode(OLD).decode()],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert appended.returncode == 2 and "unknown event type" in appended.stderr, appended.stderr
