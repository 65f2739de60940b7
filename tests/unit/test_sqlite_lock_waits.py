"""Waiting for another process's SQLite write lock: in slices, so a cancelled caller stops at once.

SQLite's busy handler cannot be interrupted, and a call on the worker thread cannot be abandoned; with one
busy timeout for the whole wait a SIGTERM'd engine whose log was locked took up to its lease twice over to stop
(29 s). Each attempt now waits at most a slice and writes nothing when it finds the lock taken; the wait goes on
across slices up to the timeout. (A commit an append joined still runs to its end, shielded: see
:mod:`loopd_es.log.group_commit`.)
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import anyio
import pytest

from loopd_es.errors import LockTimeoutError
from loopd_es.events.envelope import NewEvent
from loopd_es.log.coord import Claim
from loopd_es.log.sqlite import WAIT_SLICE_MS, SqliteLog
from tests.waits import alet_time_pass, scaled_timeout

pytestmark = pytest.mark.anyio


def _locked(path: Path) -> sqlite3.Connection:
    locker = sqlite3.connect(path, isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")  # no other connection can write now
    return locker


async def test_a_cancelled_lease_renewal_stops_within_a_slice_and_writes_nothing(tmp_path: Path) -> None:
    # a SIGTERM'd engine renewing its lease on a locked log once waited out the whole busy timeout
    store = await SqliteLog.open(tmp_path / "log.db")
    try:
        await store.append("s", [NewEvent(type="t.x")])
        claim = Claim(key="lease", holder="me", token=1, expires_us=10**15)
        locker = _locked(tmp_path / "log.db")
        try:
            started = time.monotonic()
            with anyio.move_on_after(0.3) as scope:
                await store.coord_swap("lease", 0, claim)
            took = time.monotonic() - started
            assert scope.cancelled_caught
            # the whole timeout is 60 s; a cancel lands at the end of the slice under way (a wide margin on top)
            assert took < 0.3 + 20 * WAIT_SLICE_MS / 1000, took
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        assert await store.coord_read("lease") == []  # the cancelled swap wrote nothing
        assert await store.coord_swap("lease", 0, claim) is None  # and left no transaction open
    finally:
        await store.aclose()


async def test_the_wait_goes_on_across_slices_up_to_the_timeout(tmp_path: Path) -> None:
    store = await SqliteLog.open(tmp_path / "log.db")
    try:
        store.busy_timeout_ms = int(
            scaled_timeout(30) * 1000
        )  # far past the release, however slow the machine
        locker = _locked(tmp_path / "log.db")
        released_at: list[float] = []

        async def release_later() -> None:
            await alet_time_pass(3 * WAIT_SLICE_MS / 1000, "the append waits past several slices")
            released_at.append(time.monotonic())
            locker.execute("ROLLBACK")

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(release_later)
                assert [e.version for e in await store.append("s", [NewEvent(type="t.x")])] == [1]
            assert released_at  # it landed after the release: it did not give up after a slice
            store.busy_timeout_ms = 3 * WAIT_SLICE_MS  # now the lock outlasts the timeout: a lock timeout
            locker.execute("BEGIN EXCLUSIVE")
            with pytest.raises(LockTimeoutError):
                await store.append("s", [NewEvent(type="t.x")])
        finally:
            if locker.in_transaction:
                locker.execute("ROLLBACK")
            locker.close()
        assert await store.stream_version("s") == 1
    finally:
        await store.aclose()
