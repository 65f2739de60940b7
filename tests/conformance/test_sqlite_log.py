"""The log contract on the SQLite backend, plus what only a database file has to get right."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest

from loopd_es.errors import LogNotFoundError, StoreUnavailableError, UsageError
from loopd_es.log import open_store
from loopd_es.log.sqlite import SqliteLog

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

    async def test_unknown_option_is_a_usage_error(self, tmp_path: Path) -> None:
        with pytest.raises(UsageError):
            await open_store(f"sqlite:{tmp_path / 'log.db'}?synchronous=SOMETIMES")
        with pytest.raises(UsageError):
            await open_store(f"sqlite:{tmp_path / 'log.db'}?colour=blue")


class TestSqliteLogSynchronousNormal(TestSqliteLog):
    @pytest.fixture
    def store_url(self, tmp_path: Path) -> str:
        return f"sqlite:{tmp_path / 'log.db'}?synchronous=NORMAL"

    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[LogStore]:
        async with await SqliteLog.open(tmp_path / "log.db", synchronous="NORMAL") as s:
            yield s
