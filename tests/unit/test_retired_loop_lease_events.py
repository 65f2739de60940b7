"""/loop owners' leases live beside the log, never in it: the ``loop.owner_lease_*`` events that logs written
before 0.4 hold on ``loop-lease-<owner>`` streams are no event type any more. Such a log still reads, replays,
verifies and schedules (nothing decodes those streams), and nothing can append one again."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio
import msgspec
import pytest

from loopd_es.clock import from_ms
from loopd_es.errors import InvalidEventError
from loopd_es.events import loop as ev
from loopd_es.events.base import CATALOGUE
from loopd_es.events.catalogue import new_event, validate
from loopd_es.events.envelope import NewEvent
from loopd_es.log import open_store

RETIRED = ("loop.owner_lease_renewed", "loop.owner_lease_released", "loop.task_counted")
"""Coordination once written as events: owners' leases (before 0.4) and the 50-task cap's fence."""
T0 = 1_780_000_000_000
V1_RENEWED = {"owner": "o", "at": T0, "expires_at": T0 + 15_000}  # as a 0.3 scheduler wrote it: epoch ms


def test_no_owner_lease_is_an_event_type() -> None:
    assert not [t for t in CATALOGUE if t in RETIRED], (
        "/loop leases and the task cap are coordination records"
    )
    for type_ in RETIRED:
        with pytest.raises(InvalidEventError, match="unknown event type"):
            validate(type_, msgspec.json.encode(V1_RENEWED))


async def _old_log(url: str) -> None:
    created = ev.TaskCreated(task_id="t1", origin_id="m1", session_id="s1", prompt="check CI", mode="fixed",
                             interval_ms=60_000, created_at=from_ms(T0), next_due_at=from_ms(T0 + 60_000))  # fmt: skip
    async with await open_store(url) as store:  # what a /loop scheduler of 0.3 wrote beside its tasks
        await store.append(
            f"{ev.LEASE_PREFIX}o", [NewEvent(type=RETIRED[0], data=V1_RENEWED, schema_version=1)]
        )
        await store.append(ev.session_stream("s1"), [new_event(created)])
        await store.append(
            f"{ev.LEASE_PREFIX}o", [NewEvent(type=RETIRED[1], data={"owner": "o", "at": T0 + 1})]
        )
        counted = {
            "task_id": "t1",
            "session_id": "s1",
        }  # the cap's fence, as earlier versions wrote it with each creation
        await store.append(ev.CAP_STREAM, [NewEvent(type=RETIRED[2], data=counted)])


def test_a_log_from_before_0_4_still_reads_replays_verifies_and_lists_its_loops(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'events.db'}"
    anyio.run(_old_log, url)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "loopd_es", "--store", url, *args], capture_output=True,
                              text=True, env=env, timeout=60)  # fmt: skip

    for args in (
        ["verify"],
        ["replay"],
        ["read", "--stream", "loop-lease-o"],
        ["read", "--stream", "loop-cap"],
    ):
        done = cli(*args)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
    listed = cli("loop", "--session", "s1", "--now", str(T0 + 1_000), "--json", "list")
    assert listed.returncode == 0, listed.stderr
    assert "t1" in listed.stdout and "check CI" in listed.stdout, listed.stdout
    loops = cli("loops", "--json", "--read-db", str(tmp_path / "read.db"))
    assert loops.returncode == 0, loops.stderr
    assert "t1" in json.dumps(json.loads(loops.stdout)), loops.stdout
    appended = cli(
        "append", "--stream", "loop-lease-o", "--type", RETIRED[0], "--data", json.dumps(V1_RENEWED)
    )
    assert appended.returncode == 2 and "unknown event type" in appended.stderr, appended.stderr
