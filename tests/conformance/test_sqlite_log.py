"""The log contract on the SQLite backend, plus what only a database file has to get right."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel
import pytest

from loopd_es.errors import (
    LogNotFoundError,
    NotALogError,
    StoreUnavailableError,
    UsageError,
    WrongExpectedVersionError,
)
from loopd_es.events.envelope import NO_STREAM, NewEvent
from loopd_es.log import open_store
from loopd_es.log.coord import Claim, Fence, FenceLostError
from loopd_es.log.sqlite import BUSY_TIMEOUT_MS, WAIT_SLICE_MS, SqliteLog
from loopd_es.testing import IntegrityContract, LogStoreContract, assert_log_invariants, everything, new
from tests.waits import alet_time_pass, await_until, scaled_timeout

if TYPE_CHECKING:
    from loopd_es.log.base import LogStore
    from loopd_es.log.group_commit import Request

pytestmark = pytest.mark.anyio

_FIXTURES = Path(__file__).parent.parent / "fixtures"


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
                await alet_time_pass(0.5, "the other writer holds its transaction while the append tries")
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

    async def test_cancelled_while_waiting_for_another_writer_tells_the_truth(
        self, store: LogStore, tmp_path: Path
    ) -> None:
        """The commit moves to the worker thread while another process holds the write lock; cancel then."""
        await store.append("s", [new()])
        con = sqlite3.connect(tmp_path / "log.db", isolation_level=None)
        outcomes: dict[int, object] = {}
        try:
            con.execute("BEGIN IMMEDIATE")

            async def writer(w: int, scope: anyio.CancelScope) -> None:
                with scope:
                    outcomes[w] = await store.append(f"w{w}", [new(w=w)])
                if scope.cancelled_caught:
                    outcomes[w] = "cancelled"

            scopes = [anyio.CancelScope() for _ in range(4)]
            with anyio.fail_after(scaled_timeout(30)):
                async with anyio.create_task_group() as tg:
                    for w in range(4):
                        tg.start_soon(writer, w, scopes[w])
                    assert isinstance(store, SqliteLog)
                    await await_until(
                        "the group's commit to wait on the worker thread",
                        lambda: store._in_flight > 0,  # a call on (or queued for) the worker thread
                    )
                    for scope in scopes[:2]:
                        scope.cancel()
                    await alet_time_pass(0.2, "the cancellations land while the other process holds the lock")
                    con.execute("COMMIT")
        finally:
            con.close()
        envs = await everything(store)
        for w in range(4):
            landed = [e for e in envs if e.stream == f"w{w}"]
            if outcomes[w] == "cancelled":
                assert landed == [], f"writer {w} told cancelled, yet its event landed"
            else:
                assert outcomes[w] == landed, f"writer {w}: acknowledged but not as recorded"
        assert all(outcomes[w] != "cancelled" for w in (2, 3))
        assert_log_invariants(envs)

    async def test_reads_answer_at_once_while_an_append_waits_for_another_writer(
        self, store: LogStore, tmp_path: Path
    ) -> None:
        """Short reads run on their own read-only connection: they neither wait behind a commit queued on the
        worker thread nor see what is not committed yet."""
        assert isinstance(store, SqliteLog)
        await store.append("s", [new()])
        con = sqlite3.connect(tmp_path / "log.db", isolation_level=None)
        try:
            con.execute("BEGIN IMMEDIATE")
            async with anyio.create_task_group() as tg:
                tg.start_soon(store.append, "s", [new(n=2)])
                await await_until("the append to wait on the worker thread", lambda: store._in_flight > 0)
                with anyio.fail_after(scaled_timeout(5)):  # before: queued behind the append (60 s)
                    assert await store.head() == 1
                    assert await store.stream_version("s") == 1
                    assert [e.version async for e in store.read_stream("s")] == [1]
                    assert await store.coord_read() == []
                assert store._in_flight > 0, "the append was still waiting while the reads answered"
                con.execute("COMMIT")
        finally:
            con.close()
        assert await store.stream_version("s") == 2

    async def test_concurrent_appenders_at_different_paces_share_commits(self, store: LogStore) -> None:
        """Appenders doing other work between appends (as tool calls do) still commit in groups: a commit
        on the event-loop thread would hold up every ready appender for its sync, so each would commit alone."""
        assert isinstance(store, SqliteLog)
        groups: list[int] = []
        inline, threaded = store._group._commit_now, store._group._commit
        assert inline is not None

        def counted_inline(group: list[Request]) -> bool:
            done = inline(group)
            if done:
                groups.append(len(group))
            return done

        async def counted(group: list[Request]) -> None:
            groups.append(len(group))
            await threaded(group)

        store._group._commit_now, store._group._commit = counted_inline, counted
        tasks, appends = 30, 4

        async def appender(i: int) -> None:
            for n in range(appends):
                for _ in range(i + 1):  # other work, a different amount for each appender
                    await anyio.lowlevel.checkpoint()
                await store.append(f"a{i}", [new(n=n)])

        async with anyio.create_task_group() as tg:
            for i in range(tasks):
                tg.start_soon(appender, i)
        assert sum(groups) == tasks * appends
        assert len(groups) <= tasks * appends / 4, f"{len(groups)} commits for {tasks * appends} appends"

    async def test_busy_timeout_is_restored_after_an_inline_commit(self, store: LogStore) -> None:
        """An uncontended commit runs with a zero busy timeout; whatever runs next must wait again (in slices of
        WAIT_SLICE_MS, made again up to BUSY_TIMEOUT_MS: tests/unit/test_sqlite_lock_waits.py)."""
        assert isinstance(store, SqliteLog)
        await store.append("s", [new()])
        timeout = await store._run(lambda conn: conn.execute("PRAGMA busy_timeout").fetchone()[0])
        assert timeout == WAIT_SLICE_MS and store.busy_timeout_ms == BUSY_TIMEOUT_MS

    def test_no_private_aiosqlite_api(self) -> None:
        """No module of the log reaches into a driver's private attributes (aiosqlite's ``_execute`` and
        ``_conn`` once were); SQLite runs on the stdlib ``sqlite3`` module's public API."""
        root = Path(__file__).resolve().parents[2]
        modules = sorted((root / "loopd_es/log").glob("*.py"))
        assert root / (SqliteLog.__module__.replace(".", "/") + ".py") in modules  # the glob found the log
        for module in modules:
            text = module.read_text()
            assert "aiosqlite" not in text and "._execute" not in text and "_conn._conn" not in text, module

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

    async def test_many_streams_and_fences_beyond_the_bound_variable_limit(self, store: LogStore) -> None:
        """One append_many to 600 streams and a batch with 600 fences, SQLite's variable limit at 999."""
        assert isinstance(store, SqliteLog)
        await store._run(lambda conn: conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999))
        await store.coord_swap("k", 0, Claim(key="k", holder="a", token=1, expires_us=1))
        written = await store.append_many([(f"s-{i}", [new()], 0) for i in range(600)])
        assert [w[0].position for w in written] == list(range(1, 601))
        fences = [Fence("k", 1)] * 600
        await store.append("s-0", [new(i=i) for i in range(200)], 1, fences=fences)
        await store.append("s-0", [new()], 201, fences=fences)
        with pytest.raises(FenceLostError):
            await store.append("s-0", [new()], 202, fences=[*fences, Fence("k", 2)])
        assert await store.head() == 801
        assert_log_invariants(await everything(store))

    @pytest.mark.parametrize("create", [False, True])
    async def test_another_applications_database_is_refused_untouched(
        self, tmp_path: Path, create: bool
    ) -> None:
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

    async def test_every_write_path_stores_the_checksum_verify_computes(self, store: LogStore) -> None:
        """The append paths compute each row's checksum inline (not through ``row_crc``): verify recomputes it."""
        linked = NewEvent(type="test.linked", data=b'{"raw": 1}', causation_id="c-1", correlation_id="r-1")
        await store.append("lone", [new(n=1)])  # one INSERT from the remembered head
        await store.append("lone", [new(n=2), linked], 1)  # a multi-row INSERT
        await store.append_many([("a", [new()]), ("b", [new(), new()])])
        async with anyio.create_task_group() as tg:  # a group of requests on the worker thread
            for i in range(5):
                tg.start_soon(store.append, f"g{i}", [new(i=i)])
        report = await store.verify()
        assert report.ok and report.events == 11, report.problems

    async def test_verify_detects_an_edit_that_stays_valid_json(
        self, store: LogStore, tmp_path: Path
    ) -> None:
        await store.append("s", [new(amount=10), new(amount=20)])
        assert (await store.verify()).ok
        con = sqlite3.connect(tmp_path / "log.db", isolation_level=None)
        try:
            con.execute("""UPDATE events SET data = '{"amount":99}' WHERE position = 2""")
        finally:
            con.close()
        report = await store.verify()
        assert not report.ok
        assert any("position 2" in p and "checksum" in p for p in report.problems), report.problems
        assert [e.data_dict() for e in await everything(store)] == [
            {"amount": 10},
            {"amount": 99},
        ]  # envelope unchanged

    async def test_a_log_written_before_checksums_is_read_untouched_and_upgraded_by_a_writer(
        self, tmp_path: Path
    ) -> None:
        path = tmp_path / "old.db"
        con = sqlite3.connect(path, isolation_level=None)
        con.execute(_OLD_SCHEMA)
        con.execute("PRAGMA journal_mode = WAL")
        con.execute(
            "INSERT INTO events VALUES (1, 's', 1, '01a2390e-e4d0-7000-b93a-34ab9f82a9bd', 't.x', 1,"
            " '2026-01-01T00:00:00.000000Z', NULL, NULL, X'7B7D')"
        )
        con.close()
        before = _dump(path)
        async with await SqliteLog.open(path, create=False) as s:
            assert [e.position for e in await everything(s)] == [1]
            report = await s.verify()
            assert report.ok and any("before per-event checksums" in n for n in report.notes)
        assert _dump(path) == before, "a reader altered an old log"
        async with await SqliteLog.open(path) as s:  # a writer adds the checksums
            await s.append("s", [new()], 1)
            report = await s.verify()
            assert report.ok and report.notes == [] and report.events == 2
        con = sqlite3.connect(path, isolation_level=None)
        con.execute("UPDATE events SET type = 't.y' WHERE position = 1")
        con.close()
        async with await SqliteLog.open(path, create=False) as s:
            assert any("position 1" in p for p in (await s.verify()).problems)

    async def test_a_stale_remembered_head_never_misplaces_an_append(self, tmp_path: Path) -> None:
        """Each connection remembers the head of its own last commit; another connection's commits make it
        stale, and every append must still land at the true head and version, or fail as it should."""
        path = tmp_path / "log.db"
        async with await SqliteLog.open(path) as a, await SqliteLog.open(path) as b:
            await a.append("s", [new()], 0)
            await b.append("s", [new()], 1)
            with pytest.raises(WrongExpectedVersionError) as caught:
                await a.append("s", [new()], 1)  # a still remembers version 1: the store must not believe it
            assert caught.value.actual == 2
            await a.append("s", [new(), new()], 2)
            await a.append("t", [new()])
            await b.append("u", [new()])
            await a.append("t", [new()], 1)  # a's head is stale though t is unchanged
            retried = [new()]
            first = await b.append("u", retried, 1)
            assert await a.append("u", retried, 1) == first  # a retry through the stale connection
            await b.coord_swap("lease", 0, Claim(key="lease", holder="b", token=1, expires_us=1))
            await a.append("t", [new()], 2, fences=[Fence("lease", 1)])
            await b.coord_swap("lease", 1, Claim(key="lease", holder="b", token=2, expires_us=1))
            with pytest.raises(FenceLostError):
                await a.append("t", [new()], 3, fences=[Fence("lease", 1)])
            with pytest.raises(FenceLostError):  # several streams, one statement, the same fence
                await a.append_many([("t", [new()], 3), ("v", [new()], 0)], fences=[Fence("lease", 1)])
            await b.append("t", [new()], 3)
            with pytest.raises(WrongExpectedVersionError):
                await a.append_many([("v", [new()], 0), ("t", [new()], 3)])
            await a.append_many([("v", [new()], 0), ("t", [new(), new()], 4)], fences=[Fence("lease", 2)])
            envs = await everything(a)
        assert_log_invariants(envs)
        assert [(e.stream, e.version) for e in envs] == [
            ("s", 1), ("s", 2), ("s", 3), ("s", 4), ("t", 1), ("u", 1), ("t", 2), ("u", 2), ("t", 3),
            ("t", 4), ("v", 1), ("t", 5), ("t", 6),
        ]  # fmt: skip

    async def test_a_log_written_by_the_first_layout_opens_reads_and_takes_appends(
        self, tmp_path: Path
    ) -> None:
        """A copy of a log written by loopd-es before the fast commit path (tests/fixtures), read and extended."""
        path = tmp_path / "layout1.db"
        shutil.copyfile(_FIXTURES / "sqlite_log_layout1.db", path)
        async with await SqliteLog.open(path, create=False) as s:
            envs = await everything(s)
            assert [(e.stream, e.version) for e in envs] == [
                ("goal-a", 1), ("goal-a", 2), ("goal-a", 3), ("goal-b", 1), ("goal-a", 4), ("goal-c", 1)
            ]  # fmt: skip
            assert envs[3].causation_id == "11111111-1111-4111-8111-111111111111"
            assert envs[3].data_dict() == {"goal_id": "b", "text": "h\u00e9llo \u2713"}
            assert [c.holder for c in await s.coord_read("lease/")] == ["w1"]
            assert (await s.verify()).ok
        async with await SqliteLog.open(path) as s:
            await s.append("goal-a", [new()], 4, fences=[Fence("lease/engine", 1)])
            await s.append("goal-c", [new()], 1)
            with pytest.raises(WrongExpectedVersionError):
                await s.append("goal-b", [new()], 0)
            report = await s.verify()
            assert report.ok and report.events == 8
            assert_log_invariants(await everything(s))

    async def test_unknown_option_is_a_usage_error(self, tmp_path: Path) -> None:
        with pytest.raises(UsageError):
            await open_store(f"sqlite:{tmp_path / 'log.db'}?synchronous=SOMETIMES")
        with pytest.raises(UsageError):
            await open_store(f"sqlite:{tmp_path / 'log.db'}?colour=blue")


_OLD_SCHEMA = """
CREATE TABLE events (
    position INTEGER PRIMARY KEY, stream TEXT NOT NULL, version INTEGER NOT NULL, event_id TEXT NOT NULL UNIQUE,
    type TEXT NOT NULL, schema_version INTEGER NOT NULL, recorded_at TEXT NOT NULL, causation_id TEXT,
    correlation_id TEXT, data BLOB NOT NULL, UNIQUE (stream, version)
)
"""


def _dump(path: Path) -> list[str]:
    con = sqlite3.connect(path)
    try:
        return list(con.iterdump())
    finally:
        con.close()


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
