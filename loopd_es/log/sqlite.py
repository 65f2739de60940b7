"""The SQLite backend (the default): WAL, ``synchronous=FULL``, ``BEGIN IMMEDIATE`` with a busy timeout.

Each append transaction — id checks, version check, inserts, commit — runs as one function on
aiosqlite's connection thread, so a commit costs one thread hand-off, not one per statement; appends
that arrive while a commit is in flight are gathered into the next transaction (group commit).
Reads fetch :data:`~loopd_es.log.base.READ_BATCH` rows per hand-off.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, Final, TypeVar

import aiosqlite
import anyio
import anyio.lowlevel
import msgspec

from ..errors import (
    CorruptLogError,
    LockTimeoutError,
    LoopdError,
    StorageError,
    StoreUnavailableError,
    UsageError,
    WrongExpectedVersionError,
)
from ..events.envelope import ANY, Envelope, ExpectedVersion, NewEvent, now_rfc3339
from .base import (
    READ_BATCH,
    LogStore,
    SequenceChecker,
    VerifyReport,
    check_expected_version,
    check_stream_name,
    parse_expected_version,
)
from .group_commit import GroupCommitter, Request, prepare_path
from .validation import check_new_events, resolve_retry

T = TypeVar("T")

SYNCHRONOUS: Final = ("FULL", "NORMAL", "OFF", "EXTRA")
BUSY_TIMEOUT_MS: Final = 60_000
_COLUMNS: Final = (
    "position, stream, version, event_id, type, schema_version, recorded_at, causation_id, correlation_id, data"
)
_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS events (
    position       INTEGER PRIMARY KEY,
    stream         TEXT    NOT NULL,
    version        INTEGER NOT NULL,
    event_id       TEXT    NOT NULL UNIQUE,
    type           TEXT    NOT NULL,
    schema_version INTEGER NOT NULL,
    recorded_at    TEXT    NOT NULL,
    causation_id   TEXT,
    correlation_id TEXT,
    data           BLOB    NOT NULL,
    UNIQUE (stream, version)
);
"""


class SqliteLog(LogStore):
    """An append-only log in one SQLite database, safe for many processes appending at once."""

    def __init__(self, path: Path, conn: aiosqlite.Connection) -> None:
        self.path = path
        self.url = f"sqlite:{path}"
        self._conn = conn
        self._group = GroupCommitter(self._commit)
        self._closed = False
        self._in_flight = 0  # calls queued on the connection thread; inline commits need it idle
        self._busy_timeout = BUSY_TIMEOUT_MS

    @classmethod
    async def open(cls, path: Path, *, synchronous: str = "FULL", create: bool = True) -> SqliteLog:
        """Open (or create) the database at ``path`` and make sure its schema exists.

        :raises UsageError: for an unknown ``synchronous`` level.
        :raises StoreUnavailableError: when the file cannot be opened or is not a loopd-es database.
        """
        level = synchronous.upper()
        if level not in SYNCHRONOUS:
            raise UsageError(f"unknown synchronous level {synchronous!r}: use one of {', '.join(SYNCHRONOUS)}")
        prepare_path(path, create=create)
        try:
            conn = await aiosqlite.connect(
                path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False
            )
        except sqlite3.Error as e:
            raise StoreUnavailableError(f"cannot open {path}: {e}; check --store and permissions") from e
        store = cls(path, conn)
        try:
            await store._run(_setup, level)
        except BaseException:
            await conn.close()
            raise
        return store

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(sqlite3_connection, *args)`` on the connection thread: one hand-off, errors translated."""
        if self._closed:
            raise StorageError(f"{self.url} is closed; open the store again")
        conn = self._conn
        self._in_flight += 1
        try:
            # aiosqlite's public API costs one hand-off per statement; _execute runs a whole function.
            return await conn._execute(lambda: fn(conn._conn, *args))  # type: ignore[no-untyped-call,no-any-return]
        except LoopdError:
            raise
        except sqlite3.Error as e:
            raise _translate(e, self.path) from e
        finally:
            self._in_flight -= 1

    async def _commit(self, group: list[Request]) -> None:
        """Commit a group: inline when the connection is idle and the write lock is free, else on its thread.

        A thread hand-off costs about half an fsync here, so an uncontended commit runs on the event-loop
        thread with a zero busy timeout (like the NDJSON backend's fsync); only when another process holds
        the write lock does it move to the connection thread, where waiting does not block the loop.
        """
        if self._in_flight == 0 and not self._closed:
            conn = self._conn._conn
            try:
                if self._busy_timeout:
                    conn.execute("PRAGMA busy_timeout = 0")
                    self._busy_timeout = 0
                _commit_group(conn, group)
                return
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) and "busy" not in str(e):
                    raise _translate(e, self.path) from e
            except LoopdError:
                raise
            except sqlite3.Error as e:
                raise _translate(e, self.path) from e
        await self._run(_commit_group_waiting, group)
        self._busy_timeout = BUSY_TIMEOUT_MS

    # -- writing ------------------------------------------------------------------------------------

    async def append(
        self, stream: str, events: Sequence[NewEvent], expected_version: ExpectedVersion = ANY
    ) -> list[Envelope]:
        check_stream_name(stream)
        expected_version = parse_expected_version(expected_version)
        events = check_new_events(events)
        if not events:
            return []
        return await self._group.submit(Request(stream, events, expected_version))

    # -- reading ------------------------------------------------------------------------------------

    async def read_batches(
        self,
        *,
        from_position: int = 1,
        limit: int | None = None,
        stream: str | None = None,
        from_version: int = 1,
    ) -> AsyncIterator[list[Envelope]]:
        remaining = limit if limit is not None else -1
        after = max(from_position, 1) - 1 if stream is None else max(from_version, 1) - 1
        while remaining != 0:
            size = READ_BATCH if remaining < 0 else min(READ_BATCH, remaining)
            batch = await self._run(_read_rows, stream, after, size)
            if not batch:
                return
            yield batch
            if len(batch) < size:
                return
            after = batch[-1].position if stream is None else batch[-1].version
            if remaining > 0:
                remaining -= len(batch)
            await anyio.lowlevel.checkpoint()

    async def head(self) -> int:
        return await self._run(_head)

    async def stream_version(self, stream: str) -> int:
        return await self._run(_stream_version, stream)

    async def streams(self) -> list[str]:
        return await self._run(_streams)

    async def verify(self, *, repair: bool = False) -> VerifyReport:
        report = VerifyReport(self.url)
        await self._run(_verify, report)
        if repair and not report.ok:
            report.repaired.append("SQLite logs are repaired by SQLite itself; nothing to truncate")
        return report

    async def import_envelopes(self, batches: AsyncIterator[list[Envelope]]) -> int:
        await self._run(_begin_import, self.url)
        checker = SequenceChecker(self.url)
        try:
            async for batch in batches:
                for env in batch:
                    checker.check(env)
                await self._run(_insert_verbatim, batch)
            await self._run(_finish_import)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._run(_rollback)
            raise
        return checker.position

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self._conn.close()


# -- functions that run on the connection thread ----------------------------------------------------


def _setup(conn: sqlite3.Connection, synchronous: str) -> None:
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    if str(mode).lower() != "wal":
        raise StoreUnavailableError(f"cannot switch the database to WAL mode (it stays in {mode!r})")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    conn.execute("BEGIN IMMEDIATE")
    try:
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)
        columns = [row[1] for row in conn.execute("PRAGMA table_info(events)")]
        if columns != [c.strip() for c in _COLUMNS.split(",")]:
            raise StoreUnavailableError(
                f"the database has an 'events' table that is not a loopd-es log (columns {columns})"
            )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _commit_group_waiting(conn: sqlite3.Connection, group: list[Request]) -> None:
    """The commit on the connection thread, willing to wait out another writer."""
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    _commit_group(conn, group)


def _commit_group(conn: sqlite3.Connection, group: list[Request]) -> None:
    """One transaction for every request of the group; a refused request does not affect the others.

    Savepoints isolate requests only when the group has several: a lone request whose ids hit the
    UNIQUE index rolls back the whole (otherwise empty) transaction instead, one statement pair cheaper.
    """
    conn.execute("BEGIN IMMEDIATE")  # outside the try: when it fails there is nothing to roll back
    isolate = len(group) > 1
    try:
        head = conn.execute("SELECT coalesce(max(position), 0) FROM events").fetchone()[0]
        recorded_at = now_rfc3339()
        if isolate and _stage_group(conn, group, head, recorded_at):
            conn.execute("COMMIT")
            return
        for request in group:
            request.error = None
            try:
                head = _stage(conn, request, head, recorded_at, isolate)
            except LoopdError as e:
                request.error = e
        conn.execute("COMMIT")
    except _SeenIds:
        conn.execute("ROLLBACK")
        (request,) = group
        try:
            request.result = _retry_of(conn, request) or []
        except LoopdError as e:
            request.error = e
        if not request.result and request.error is None:
            raise CorruptLogError(str(conn), None, "an insert hit a unique index but no recorded event matches") from None
    except BaseException:
        conn.execute("ROLLBACK")
        for request in group:
            request.result = []
        raise


def _stage_group(conn: sqlite3.Connection, group: list[Request], head: int, recorded_at: str) -> bool:
    """Stage a whole group with a handful of statements when no id in it is already taken.

    Returns False (having written nothing) when an id is already in the log or repeats across the group,
    so that the caller resolves those retries request by request, with savepoints.
    """
    ids = [new.event_id for request in group for new in request.events]
    if len(set(ids)) != len(ids):
        return False
    for i in range(0, len(ids), 500):
        chunk = ids[i : i + 500]
        marks = ",".join("?" * len(chunk))
        if conn.execute(f"SELECT 1 FROM events WHERE event_id IN ({marks}) LIMIT 1", chunk).fetchone():
            return False
    # one max() per stream: SQLite answers it from the (stream, version) index in O(log n), while a
    # GROUP BY over several streams scans every version of each of them
    versions = {stream: _stream_version(conn, stream) for stream in {request.stream for request in group}}
    rows: list[tuple[Any, ...]] = []
    staged = []
    for request in group:
        request.error = None
        stream = request.stream
        version = versions.get(stream, 0)
        try:
            check_expected_version(stream, request.expected, version)
        except WrongExpectedVersionError as e:  # no id of the group is recorded, so this is no retry
            request.error = e
            continue
        envelopes = _envelopes(request, head, version, recorded_at, rows)
        head, versions[stream] = envelopes[-1].position, envelopes[-1].version
        staged.append((request, envelopes))
    # ids are unused and versions were read under the write lock: the insert cannot hit a unique index
    conn.executemany(f"INSERT INTO events ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)", rows)
    for request, envelopes in staged:
        request.result = envelopes
    return True


def _envelopes(
    request: Request, head: int, version: int, recorded_at: str, rows: list[tuple[Any, ...]]
) -> list[Envelope]:
    """The envelopes of a request placed after ``head`` and ``version``; their rows are added to ``rows``."""
    stream = request.stream
    envelopes = []
    for new in request.events:
        head += 1
        version += 1
        data = new.data_bytes()
        rows.append(
            (head, stream, version, new.event_id, new.type, new.schema_version, recorded_at,
             new.causation_id, new.correlation_id, data)
        )
        envelopes.append(
            Envelope(
                head, stream, version, new.event_id, new.type, new.schema_version, recorded_at,
                new.causation_id, new.correlation_id, _Raw(data),
            )
        )
    return envelopes


class _SeenIds(Exception):
    """A lone request's event ids are already recorded: resolve it as a retry outside the transaction."""


def _stage(conn: sqlite3.Connection, request: Request, head: int, recorded_at: str, isolate: bool) -> int:
    """Insert one request's events; ids are checked by the UNIQUE constraint, retries resolved on a hit."""
    stream = request.stream
    version = conn.execute("SELECT coalesce(max(version), 0) FROM events WHERE stream = ?", (stream,)).fetchone()[0]
    try:
        check_expected_version(stream, request.expected, version)
    except WrongExpectedVersionError:
        retried = _retry_of(conn, request)  # a retry of an appended batch wins over the version check
        if retried is None:
            raise
        request.result = retried
        return head
    rows: list[tuple[Any, ...]] = []
    envelopes = _envelopes(request, head, version, recorded_at, rows)
    head = envelopes[-1].position
    if isolate:
        conn.execute("SAVEPOINT request")
    try:
        conn.executemany(f"INSERT INTO events ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)", rows)
    except sqlite3.IntegrityError:
        if not isolate:
            raise _SeenIds from None
        conn.execute("ROLLBACK TO request")
        conn.execute("RELEASE request")
        retried = _retry_of(conn, request)
        if retried is None:
            raise
        request.result = retried
        return head - len(rows)
    if isolate:
        conn.execute("RELEASE request")
    request.result = envelopes
    return head


def _retry_of(conn: sqlite3.Connection, request: Request) -> list[Envelope] | None:
    ids = [new.event_id for new in request.events]
    marks = ",".join("?" * len(ids))
    rows = conn.execute(f"SELECT {_COLUMNS} FROM events WHERE event_id IN ({marks})", ids)
    found = {env.event_id: env for env in map(_row_to_envelope, rows)}
    if not found:
        return None
    return resolve_retry(request.stream, request.events, [found.get(i) for i in ids])


def _row_to_envelope(row: tuple[Any, ...]) -> Envelope:
    return Envelope(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8], _Raw(row[9]))


_Raw: Final = msgspec.Raw


def _read_rows(conn: sqlite3.Connection, stream: str | None, after: int, size: int) -> list[Envelope]:
    if stream is None:
        cursor = conn.execute(
            f"SELECT {_COLUMNS} FROM events WHERE position > ? ORDER BY position LIMIT ?", (after, size)
        )
    else:
        cursor = conn.execute(
            f"SELECT {_COLUMNS} FROM events WHERE stream = ? AND version > ? ORDER BY version LIMIT ?",
            (stream, after, size),
        )
    return list(map(_row_to_envelope, cursor.fetchall()))


def _begin_import(conn: sqlite3.Connection, url: str) -> None:
    conn.execute("BEGIN IMMEDIATE")
    count = conn.execute("SELECT count(*) FROM events").fetchone()[0]
    if count:
        conn.execute("ROLLBACK")
        raise UsageError(f"{url} is not empty ({count} events); import only into a new log")


def _insert_verbatim(conn: sqlite3.Connection, batch: list[Envelope]) -> None:
    conn.executemany(
        f"INSERT INTO events ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)",
        [
            (e.position, e.stream, e.version, e.event_id, e.type, e.schema_version, e.recorded_at,
             e.causation_id, e.correlation_id, bytes(e.data))
            for e in batch
        ],
    )


def _finish_import(conn: sqlite3.Connection) -> None:
    conn.execute("COMMIT")


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        conn.execute("ROLLBACK")


def _head(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT coalesce(max(position), 0) FROM events").fetchone()[0])


def _stream_version(conn: sqlite3.Connection, stream: str) -> int:
    return int(conn.execute("SELECT coalesce(max(version), 0) FROM events WHERE stream = ?", (stream,)).fetchone()[0])


_DISTINCT_STREAMS: Final = """
WITH RECURSIVE s(stream) AS (
    SELECT min(stream) FROM events
    UNION ALL
    SELECT (SELECT min(stream) FROM events WHERE stream > s.stream) FROM s WHERE s.stream IS NOT NULL
)
SELECT stream FROM s WHERE stream IS NOT NULL
"""


def _streams(conn: sqlite3.Connection) -> list[str]:
    # a skip-scan of the (stream, version) index: one seek per stream, not one step per event
    return [row[0] for row in conn.execute(_DISTINCT_STREAMS)]


def _verify(conn: sqlite3.Connection, report: VerifyReport) -> None:
    where = str(report.url)
    check = conn.execute("PRAGMA quick_check").fetchone()[0]
    if check != "ok":
        report.problems.append(f"{where}: SQLite quick_check: {check}")
    count, low, high = conn.execute("SELECT count(*), min(position), max(position) FROM events").fetchone()
    report.events = count
    if count and (low != 1 or high != count):
        report.problems.append(f"{where}: positions are not gapless: {count} events span {low}..{high}")
    rows = conn.execute("SELECT stream, count(*), min(version), max(version) FROM events GROUP BY stream").fetchall()
    report.streams = len(rows)
    for stream, n, vmin, vmax in rows:
        if vmin != 1 or vmax != n:
            report.problems.append(f"{where}: stream {stream!r}: {n} events span versions {vmin}..{vmax}")
    decoder = msgspec.json.Decoder()
    for position, data in conn.execute("SELECT position, data FROM events ORDER BY position"):
        try:
            value = decoder.decode(data)
        except msgspec.DecodeError as e:
            report.problems.append(f"{where}: event at position {position}: data does not decode: {e}")
            continue
        if not isinstance(value, dict):
            report.problems.append(f"{where}: event at position {position}: data is not a JSON object")
        if len(report.problems) >= 20:
            report.problems.append("... stopping after 20 problems")
            return


def _translate(error: sqlite3.Error, path: Path) -> LoopdError:
    text = str(error)
    if "locked" in text or "busy" in text:
        return LockTimeoutError(str(path), BUSY_TIMEOUT_MS / 1000)
    if "malformed" in text or "not a database" in text:
        return CorruptLogError(str(path), None, f"SQLite says: {text}")
    return StoreUnavailableError(f"SQLite error on {path}: {text}; check the path, permissions and free space")
