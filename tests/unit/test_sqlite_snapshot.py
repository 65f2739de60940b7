"""The read-only SQLite snapshot reads what the store reads, never suspends, and refuses every write."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Awaitable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest

from loopd_es.errors import NotALogError, StorageError
from loopd_es.events.envelope import Envelope, NewEvent
from loopd_es.log import open_store
from loopd_es.log.base import READ_BATCH, LogStore, NeedsEventLoop
from loopd_es.log.coord import Claim
from loopd_es.log.sqlite_snapshot import ReadOnlySnapshotError, SqliteSnapshot

T = TypeVar("T")


def _now(awaitable: Awaitable[T]) -> T:
    """Run a snapshot call to its end in one step: it must never suspend (there is no loop here)."""
    assert isinstance(awaitable, Coroutine)
    try:
        awaitable.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    raise AssertionError("the snapshot suspended")


def _all(batches: AsyncIterator[list[Envelope]]) -> list[list[Envelope]]:
    async def collect() -> list[list[Envelope]]:
        return [batch async for batch in batches]

    return _now(collect())


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """More than one read batch of events over three streams, and a coordination record."""
    path = tmp_path_factory.mktemp("snapshot") / "events.db"

    async def fill() -> None:
        async with await open_store(f"sqlite:{path}") as store:
            for n in range(READ_BATCH // 100 + 2):
                stream = ("goal-a", "goal-b", "notifications")[n % 3]
                kind = "goal.retried" if n % 2 else "goal.paused"
                await store.append(
                    stream, [NewEvent(type=kind, data={"goal_id": f"{n}.{i}"}) for i in range(100)]
                )
            claim = Claim(key="lease/x", holder="me", token=1, expires_us=4_000_000_000_000_000)
            assert await store.coord_swap("lease/x", 0, claim) is None

    anyio.run(fill)
    return path


READS: list[tuple[str, dict[str, Any]]] = [
    ("read_batches", {}),
    ("read_batches", {"from_position": 4000, "limit": 300}),
    ("read_batches", {"stream": "goal-b", "from_version": 50}),
    ("read_batches", {"stream": "goal-a", "limit": 0}),
    ("read_filtered", {"types": ["goal.paused"], "limit": 4500}),
    ("read_filtered", {"stream_prefix": "goal-", "from_position": 10}),
    ("read_backwards", {"stream": "notifications", "limit": 250}),
    ("read_backwards", {"start": 4100}),
]


@pytest.mark.parametrize(("method", "options"), READS)
def test_the_snapshot_reads_what_the_store_reads(log: Path, method: str, options: dict[str, Any]) -> None:
    async def through_store() -> list[list[Envelope]]:
        async with await open_store(f"sqlite:{log}", create=False) as store:
            return [batch async for batch in getattr(store, method)(**options)]

    expected = anyio.run(through_store)
    snapshot = SqliteSnapshot.open(log)
    try:
        got = _all(getattr(snapshot, method)(**options))
    finally:
        _now(snapshot.aclose())
    assert [e for b in got for e in b] == [e for b in expected for e in b]
    assert all(len(b) <= READ_BATCH for b in got)


def test_the_snapshot_answers_the_small_reads_as_the_store_does(log: Path) -> None:
    async def through_store() -> tuple[Any, ...]:
        async with await open_store(f"sqlite:{log}", create=False) as store:
            return await _small(store)

    snapshot = SqliteSnapshot.open(log)
    try:
        assert _now(_small(snapshot)) == anyio.run(through_store)
        assert _now(snapshot.head()) > READ_BATCH
        assert _now(snapshot.verify()).ok
    finally:
        _now(snapshot.aclose())


async def _small(store: LogStore) -> tuple[Any, ...]:
    return (
        await store.head(),
        await store.streams(),
        await store.stream_version("goal-b"),
        await store.stream_version("nothing"),
        await store.coord_read("lease/"),
    )


def test_every_write_is_refused_and_the_log_is_unchanged(log: Path) -> None:
    before = log.read_bytes()
    snapshot = SqliteSnapshot.open(log)
    try:
        with pytest.raises(ReadOnlySnapshotError, match="read-only"):
            _now(snapshot.append("goal-a", [NewEvent(type="goal.paused", data={"goal_id": "a"})]))
        with pytest.raises(ReadOnlySnapshotError, match="lease or claim"):
            _now(snapshot.coord_swap("lease/x", 1, None))
        with pytest.raises(ReadOnlySnapshotError, match="cannot import"):
            _now(snapshot.import_envelopes(_no_batches()))
        with pytest.raises(ReadOnlySnapshotError, match="cannot be repaired"):
            _now(snapshot.verify(repair=True))
    finally:
        _now(snapshot.aclose())
    assert log.read_bytes() == before


async def _no_batches() -> AsyncIterator[list[Envelope]]:
    empty: tuple[list[Envelope], ...] = ()
    for batch in empty:
        yield batch


def test_a_closed_snapshot_says_so(log: Path) -> None:
    snapshot = SqliteSnapshot.open(log)
    _now(snapshot.aclose())
    with pytest.raises(StorageError, match="is closed"):
        _now(snapshot.head())


def test_what_only_the_store_can_answer_needs_the_event_loop(tmp_path: Path) -> None:
    with pytest.raises(NeedsEventLoop, match="no log file"):
        SqliteSnapshot.open(tmp_path / "missing.db")
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()
    with pytest.raises(NeedsEventLoop, match="holds no log yet"):
        SqliteSnapshot.open(empty)
    assert not (tmp_path / "missing.db").exists()


def test_another_application_s_file_is_refused_untouched(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database at all, but long enough to look like a header" * 20)
    for path in (other, garbage):
        before = path.read_bytes()
        with pytest.raises(NotALogError):
            SqliteSnapshot.open(path)
        assert path.read_bytes() == before
