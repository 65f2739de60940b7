"""A short hold on a coordination record (the writer slot, the /loop task cap): one holder at a time, a crashed
holder taken over once its record runs out and fenced off, a busy record reported after the wait."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest

from loopd_es.clock import from_ms
from loopd_es.errors import ConflictError
from loopd_es.events import loop as ev
from loopd_es.events.catalogue import new_event
from loopd_es.log import open_store
from loopd_es.log.coord import FenceLostError
from loopd_es.log.coord_hold import coord_hold
from tests.waits import alet_time_pass

if TYPE_CHECKING:
    from loopd_es.events.envelope import NewEvent

pytestmark = pytest.mark.anyio

BACKENDS = ["sqlite", "ndjson", "memory"]


def _url(kind: str, tmp: Path) -> str:
    return {
        "sqlite": f"sqlite:{tmp / 'l.db'}",
        "ndjson": f"ndjson:{tmp / 'l.ndjson'}",
        "memory": f"memory:{tmp / 'mem'}",
    }[kind]


def _event() -> list[NewEvent]:
    return [new_event(ev.SessionActivated(session_id="s", at=from_ms(0)))]


@pytest.mark.parametrize("kind", BACKENDS)
async def test_one_holder_at_a_time_and_the_next_waits_for_the_release(tmp_path: Path, kind: str) -> None:
    async with await open_store(_url(kind, tmp_path)) as store:
        order: list[str] = []
        first_in = anyio.Event()

        async def first() -> None:
            async with coord_hold(store, "k", hold_us=10_000_000, wait_s=20, busy="busy"):
                order.append("first in")
                first_in.set()
                await alet_time_pass(0.3, "the second must not get in while the first holds it")
                order.append("first out")

        async def second() -> None:
            await first_in.wait()
            async with coord_hold(store, "k", hold_us=10_000_000, wait_s=20, busy="busy") as fence:
                order.append(f"second in {fence.token}")

        async with anyio.create_task_group() as tg:
            tg.start_soon(first)
            tg.start_soon(second)
        assert order == ["first in", "first out", "second in 2"]
        (record,) = await store.coord_read("k")
        assert (record.holder, record.token) == ("", 2)


@pytest.mark.parametrize("kind", BACKENDS)
async def test_a_crashed_holder_is_taken_over_when_its_record_runs_out_and_cannot_write_after(
    tmp_path: Path, kind: str
) -> None:
    async with await open_store(_url(kind, tmp_path)) as store:
        stale = coord_hold(store, "k", hold_us=200_000, wait_s=20, busy="busy")
        old_fence = await stale.__aenter__()  # never released: the process died holding it
        async with coord_hold(store, "k", hold_us=10_000_000, wait_s=20, busy="busy") as fence:
            assert fence.token == old_fence.token + 1
            with pytest.raises(FenceLostError):
                await store.append("x", _event(), fences=(old_fence,))
            await store.append("x", _event(), fences=(fence,))
        assert await store.stream_version("x") == 1


async def test_a_record_held_past_the_wait_is_reported_busy(tmp_path: Path) -> None:
    async with await open_store(_url("sqlite", tmp_path)) as store:
        async with coord_hold(store, "k", hold_us=60_000_000, wait_s=20, busy="busy"):
            with pytest.raises(ConflictError, match="^someone else holds it$"):
                async with coord_hold(
                    store, "k", hold_us=60_000_000, wait_s=0.2, busy="someone else holds it"
                ):
                    pass


async def test_a_locked_log_is_a_storage_error_not_another_holder(tmp_path: Path) -> None:
    # with cancellable lock waits, the hold's own deadline once cut a locked write short and said "busy" (exit 3)
    import sqlite3

    from loopd_es.errors import LockTimeoutError
    from loopd_es.log.sqlite import SqliteLog

    async with await open_store(_url("sqlite", tmp_path)) as store:
        assert isinstance(store, SqliteLog)
        store.busy_timeout_ms = 600
        locker = sqlite3.connect(tmp_path / "l.db", isolation_level=None)
        locker.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(LockTimeoutError):
                async with coord_hold(store, "k", hold_us=10_000_000, wait_s=0.1, busy="busy"):
                    pass
        finally:
            locker.execute("ROLLBACK")
            locker.close()


async def test_a_release_that_cannot_land_does_not_undo_what_the_hold_decided(tmp_path: Path) -> None:
    # the fenced write landed; a locked log at the release once turned that success into exit 4
    import sqlite3

    from loopd_es.log.sqlite import SqliteLog

    async with await open_store(_url("sqlite", tmp_path)) as store:
        assert isinstance(store, SqliteLog)
        locker = sqlite3.connect(tmp_path / "l.db", isolation_level=None)
        try:
            async with coord_hold(store, "k", hold_us=10_000_000, wait_s=20, busy="busy") as fence:
                await store.append("x", _event(), fences=(fence,))
                store.busy_timeout_ms = 300
                locker.execute("BEGIN IMMEDIATE")  # the release cannot write
        finally:
            if locker.in_transaction:
                locker.execute("ROLLBACK")
            locker.close()
        assert await store.stream_version("x") == 1
        (record,) = await store.coord_read("k")
        assert record.holder and record.token == fence.token  # still held: it runs out by itself
