"""The log contract on the SQLite backend, plus what only a database file has to get right."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest

from loopd_es.errors import (
    LogNotFoundError,
    NotALogError,
    StoreUnavailableError,
    UsageError,
    WrongExpectedVersionError,
)
from loopd_es.events.envelope import NO_STREAM
from loopd_es.log import open_store
from loopd_es.log.sqlite import BUSY_TIMEOUT_MS, SqliteLog

from .contract import LogStoreContract, assert_log_invariants, everything, new
from .contract_integrity import IntegrityContract

if TYPE_CHECKING:
    from loopd_es.log.base import LogStore

pytestmark = pytest.mark.anyio


class TestSqliteLog(LogStoreContract, IntegrityContract):
    @pytest.fixture
    def store_url(self, tmp_path: Path) -> str:
        return f"sqlite:{tmp_path / 'log.db'}"

    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[LogStore]:
        async with await SqliteLog.open(tmp_path / "log.db") as s:
            yield s

    # -- SQLite only -------------------------------------------------------------------------------

    async def test_open_store_url_gives_this_backend(self, store_url: str, tmp_path: Path) -> None:
        async with await open_store(store_url) as s:
            assert isinstance(s, SqliteLog)
            assert s.url.startswith("sqlite:")
        async with await open_store(str(tmp_path / "bare.db")) as s:
            assert isinstance(s, SqliteLog)

    async def test_database_is_in_wal_mode(self, store: LogStore, tmp_path: Path) -> None:
        await store.append("s", [new()])
        con = sqlite3.connect(tmp_path / "log.db")
        try:
            assert con.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal"
        finally:
            con.close()

    async def test_waits_for_another_writer_instead_of_database_is_locked(
        self, store: LogStore, tmp_path: Path
    ) -> None:
        await store.append("s", [new()])
        con = sqlite3.connect(tmp_path / "log.db", isolation_level=None)
        try:
            con.execute("BEGIN IMMEDIATE")
            released = anyio.Event()

            async def release_later() -> None:
                await anyio.sleep(0.5)
                con.execute("COMMIT")
                released.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(release_later)
                recorded = await store.append("s", [new()], 1)
                assert released.is_set(), "the append did not wait for the other writer's transaction"
            assert (recorded[0].position, recorded[0].version) == (2, 2)
        finally:
            con.close()
        assert_log_invariants(await everything(store))

    async def test_unwritable_path_is_unavailable(self, tmp_path: Path) -> None:
        (tmp_path / "a-file").write_text("not a directory")
        with pytest.raises(StoreUnavailableError):
            store = await open_store(f"sqlite:{tmp_path / 'a-file' / 'log.db'}")
            async with store:
                await store.append("s", [new()])

    async def test_missing_file_without_create_is_not_found(self, tmp_path: Path) -> None:
        with pytest.raises(LogNotFoundError):
            await SqliteLog.open(tmp_path / "absent.db", create=False)
        assert not (tmp_path / "absent.db").exists()

    async def test_busy_timeout_is_restored_after_an_inline_commit(self, store: LogStore) -> None:
        """An uncontended commit runs with a zero busy timeout; whatever runs next must wait again."""
        assert isinstance(store, SqliteLog)
        await store.append("s", [new()])
        timeout = await store._run(lambda conn: conn.execute("PRAGMA busy_timeout").fetchone()[0])
        assert timeout == BUSY_TIMEOUT_MS

    def test_no_private_aiosqlite_api(self) -> None:
        source = Path(SqliteLog.__module__.replace(".", "/") + ".py")
        root = Path(__file__).resolve().parents[2]
        for module in (root / source, root / "loopd_es/log/sqlite_ops.py"):
            text = module.read_text()
            assert "aiosqlite" not in text and "._execute" not in text and "_conn._conn" not in text

    @pytest.mark.parametrize("kind", ["conflict", "retry"])
    async def test_a_batch_beyond_the_bound_variable_limit(self, store: LogStore, kind: str) -> None:
        """40,000 ids with SQLite's variable limit lowered to 999: still a conflict (3) or the originals."""
        assert isinstance(store, SqliteLog)
        await store._run(lambda conn: conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999))
        batch = [new(i=i) for i in range(40_000)]
        first = await store.append("big", batch, NO_STREAM)
        if kind == "conflict":
            with pytest.raises(WrongExpectedVersionError):
                await store.append("big", [new(i=i) for i in range(40_000)], NO_STREAM)
        else:
            again = await store.append("big", batch, NO_STREAM)
            assert again == first
        assert await store.head() == 40_000

    @pytest.mark.parametrize("create", [False, True])
    async def test_another_applications_database_is_refused_untouched(self, tmp_path: Path, create: bool) -> None:
        path = tmp_path / "other-app.db"
        con = sqlite3.connect(path)
        con.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
        con.execute("INSERT INTO notes (body) VALUES ('hello')")
        con.commit()
        con.close()
        before = path.read_bytes()
        with pytest.raises(NotALogError) as info:
            await SqliteLog.open(path, create=create)
        assert "not a loopd-es log" in str(info.value) and info.value.exit_code == 4
        assert path.read_bytes() == before
        assert _names(tmp_path) == ["other-app.db"]

    async def test_a_file_that_is_no_database_is_refused_untouched(self, tmp_path: Path) -> None:
        path = tmp_path / "notes.txt"
        path.write_text("my notes\n" * 100)
        for create in (False, True):
            with pytest.raises(NotALogError):
                await SqliteLog.open(path, create=create)
        assert path.read_text() == "my notes\n" * 100

    async def test_reading_an_empty_database_creates_nothing(self, tmp_path: Path) -> None:
        path = tmp_path / "empty.db"
        path.touch()
        with pytest.raises(LogNotFoundError):
            await SqliteLog.open(path, create=False)
        assert path.read_bytes() == b""
        async with await SqliteLog.open(path) as s:  # a writer makes it a log
            await s.append("s", [new()])
        async with await SqliteLog.open(path, create=False) as s:
            assert await s.head() == 1

    async def test_a_reader_does_not_switch_a_log_to_wal(self, tmp_path: Path) -> None:
        path = tmp_path / "log.db"
        async with await SqliteLog.open(path) as s:
            await s.append("s", [new()])
        con = sqlite3.connect(path)
        con.execute("PRAGMA journal_mode = DELETE")
        con.close()
        async with await SqliteLog.open(path, create=False) as s:
            assert await s.head() == 1
            await s.verify()
        con = sqlite3.connect(path)
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        con.close()

    async def test_unknown_option_is_a_usage_error(self, tmp_path: Path) -> None:
        with pytest.raises(UsageError):
            await open_store(f"sqlite:{tmp_path / 'log.db'}?synchronous=SOMETIMES")
        with pytest.raises(UsageError):
            await open_store(f"sqlite:{tmp_path / 'log.db'}?colour=blue")


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


class TestSqliteLogSynchronousNormal(TestSqliteLog):
    @pytest.fixture
    def store_url(self, tmp_path: Path) -> str:
        return f"sqlite:{tmp_path / 'log.db'}?synchronous=NORMAL"

    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[LogStore]:
        async with await SqliteLog.open(tmp_path / "log.db", synchronous="NORMAL") as s:
            yield s
