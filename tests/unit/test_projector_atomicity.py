"""A crash in the middle of a batch leaves the read db at the last commit: no event applied twice or skipped.

The checkpoint is written in the same transaction as the rows it covers; these tests kill the projector
between the two halves of that promise, once in-process (an exception that is not parked) and once for
real (``os._exit`` in a child process, so nothing gets to clean up).
"""

from __future__ import annotations

import os
import sqlite3
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest

from loopd_es.projector import ProjectionError, Projector
from tests.waits import scaled_timeout

from .test_projector_base import Recorder, checkpoints, dump, fill, store, url_for

if TYPE_CHECKING:
    from loopd_es.events.envelope import Envelope
    from loopd_es.log import LogStore

pytestmark = pytest.mark.anyio
__all__ = ("store",)

ROOT = Path(__file__).resolve().parents[2]
CRASH_AT = 6_000  # inside the second read batch (positions 4097..8192)


class _Crash(BaseException):
    """Stands for a process dying: not an ``Exception``, so the projector must not park it."""


class CrashingRecorder(Recorder):
    def apply(self, conn: sqlite3.Connection, envelope: Envelope) -> None:
        super().apply(conn, envelope)
        if envelope.position == CRASH_AT:
            raise _Crash


def _assert_exactly_once(read_db: Path, count: int, also: tuple[str, ...] = ()) -> None:
    rows = dump(read_db, ("recorder", *also))
    assert rows["parked"] == []  # a re-applied event would have hit the primary key and been parked
    for table in ("recorder", *also):
        assert [r[0] for r in rows[table]] == list(range(1, count + 1))  # nothing skipped
    assert checkpoints(read_db) == dict.fromkeys(("recorder", *also), count)


class Bystander(Recorder):
    """A second projection in the same transaction, so a crash can come *after* the recorder's rows."""

    name = "bystander"

    def schema(self, conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE IF NOT EXISTS bystander (position INTEGER PRIMARY KEY)")

    def apply(self, conn: sqlite3.Connection, envelope: Envelope) -> None:
        conn.execute("INSERT INTO bystander VALUES (?)", (envelope.position,))

    def reset(self, conn: sqlite3.Connection) -> None:
        conn.execute("DROP TABLE IF EXISTS bystander")


class CrashingBystander(Bystander):
    def apply(self, conn: sqlite3.Connection, envelope: Envelope) -> None:
        super().apply(conn, envelope)
        if envelope.position == CRASH_AT:
            raise _Crash


@pytest.mark.parametrize("crash_in", ["recorder", "bystander"])
async def test_an_exception_mid_batch_rolls_back_rows_and_checkpoint_together(
    store: LogStore, tmp_path: Path, crash_in: str
) -> None:
    await fill(store, 10_000)
    read_db = tmp_path / "read.db"
    crashing = (
        [CrashingRecorder(), Bystander()] if crash_in == "recorder" else [Recorder(), CrashingBystander()]
    )
    async with await Projector.open(store, crashing, read_db) as projector:
        with pytest.raises(_Crash):
            await projector.run_once()
    committed = checkpoints(read_db)["recorder"]
    assert 0 < committed < CRASH_AT and checkpoints(read_db)["bystander"] == committed
    assert len(dump(read_db)["recorder"]) == committed  # rows and checkpoint agree
    async with await Projector.open(store, [Recorder(), Bystander()], read_db) as projector:
        await projector.run_once()
    _assert_exactly_once(read_db, 10_000, also=("bystander",))


@pytest.mark.parametrize("backend", ["ndjson", "sqlite"])
async def test_a_killed_projector_resumes_exactly_where_its_last_commit_ended(
    backend: str, tmp_path: Path
) -> None:
    from loopd_es.log import open_store

    url = url_for(backend, tmp_path)
    read_db = tmp_path / "read.db"
    async with await open_store(url) as log:
        await fill(log, 10_000)
    child = textwrap.dedent(
        f"""
        import os, anyio
        from loopd_es.log import open_store
        from loopd_es.projector import Projector
        from tests.unit.test_projector_base import Recorder

        class Dying(Recorder):
            def apply(self, conn, envelope):
                super().apply(conn, envelope)
                if envelope.position == {CRASH_AT}:
                    os._exit(9)  # no rollback, no close, no atexit: like kill -9 mid-transaction

        async def main():
            store = await open_store({url!r})
            projector = await Projector.open(store, [Dying()], {str(read_db)!r})
            await projector.run_once()

        anyio.run(main)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with anyio.fail_after(scaled_timeout(30)):
        done = await anyio.run_process([sys.executable, "-c", child], env=env, cwd=tmp_path, check=False)
    assert done.returncode == 9
    committed = checkpoints(read_db)["recorder"]
    assert 0 < committed < CRASH_AT
    assert len(dump(read_db)["recorder"]) == committed
    async with await open_store(url) as log, await Projector.open(log, [Recorder()], read_db) as projector:
        assert await projector.run_once() == 10_000 - committed
    _assert_exactly_once(read_db, 10_000)


class DiskFull(Recorder):
    def apply(self, conn: sqlite3.Connection, envelope: Envelope) -> None:
        if envelope.position == 3:
            raise sqlite3.OperationalError("database or disk is full")
        super().apply(conn, envelope)


async def test_an_environmental_failure_is_not_parked_and_applies_nothing(
    store: LogStore, tmp_path: Path
) -> None:
    await fill(store, 10)
    read_db = tmp_path / "read.db"
    async with await Projector.open(store, [DiskFull()], read_db) as projector:
        with pytest.raises(ProjectionError, match="disk is full"):
            await projector.run_once()
    assert checkpoints(read_db) == {"recorder": 0}
    assert dump(read_db) == {"recorder": [], "parked": []}
