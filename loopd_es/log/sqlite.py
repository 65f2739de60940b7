"""The SQLite backend (the default): WAL, ``synchronous=FULL``, ``BEGIN IMMEDIATE`` with a busy timeout.

The store owns one plain :mod:`sqlite3` connection and runs blocking work on one worker thread at a time
(an anyio capacity limiter of 1), as the projector does. Where commits run:

- An uncontended commit (no other call on the connection, the write lock free) runs on the event-loop
  thread with a zero busy timeout: a thread hand-off costs about half an fsync here, so this is the fast
  path. Every call on the worker thread first restores the busy timeout, so nothing else runs without it.
- When another process holds the write lock, the commit moves to the worker thread and waits there (busy
  timeout :data:`~.sqlite_ops.BUSY_TIMEOUT_MS`), so waiting never blocks the loop. It waits in slices of
  :data:`WAIT_SLICE_MS` (an attempt that finds the lock still taken writes nothing and is made again), so a
  cancelled caller - a SIGTERM'd engine, say - stops within a slice instead of after the whole timeout.
- A group of several requests always commits on the worker thread: while one group syncs, the loop runs the
  callers that will form the next group (committed inline, one group's sync would hold up all of them).
- Short reads (the head, a stream's version, a coordination record, the first :data:`INLINE_ROWS` rows of a
  stream or filtered read) run on the event-loop thread on a second, read-only connection, which sees only committed rows and
  never waits (busy timeout 0: a WAL reader is refused only while a connection recovers the WAL; the read then
  goes to the worker thread). Queued behind the worker thread, 200 tool calls at once waited for ~600
  hand-offs of ~0.5 ms each to run look-ups of ~40 us (docs/performance.md).

Appends that arrive while a commit is in flight are gathered into the next transaction (group commit).
Reads fetch :data:`~loopd_es.log.base.READ_BATCH` rows per hand-off. Opening a database that is not a
loopd-es log is refused without writing to it; only a writer (``create=True``) turns an empty file into a log.
"""

from __future__ import annotations

import functools
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread

from ..errors import LoopdError, StorageError, StoreUnavailableError, UsageError
from ..events.envelope import LogRows
from ..private_files import create_private
from . import sqlite_coord, sqlite_fast, sqlite_import
from . import sqlite_ops as ops
from . import sqlite_reads as reads
from .base import (
    MAX_POSITION,
    READ_BATCH,
    LogStore,
    prefix_bounds,
    stream_rows_batches,
)
from .coord import Claim, check_swap
from .group_commit import GroupCommitter, RecentUsers, Request, prepare_path
from .invariants import SequenceChecker, VerifyReport, in_order

if TYPE_CHECKING:
    from ..events.envelope import Envelope, Recorded, StreamRows

T = TypeVar("T")
R = TypeVar("R", "Envelope", "Recorded")

SYNCHRONOUS: Final = ("FULL", "NORMAL", "OFF", "EXTRA")
BUSY_TIMEOUT_MS: Final = ops.BUSY_TIMEOUT_MS
WAIT_SLICE_MS: Final = 250
"""The longest one attempt on the worker thread waits for another process's lock; cancellation lands between."""
INLINE_ROWS: Final = 128
"""Rows a type- or prefix-filtered read fetches first on the event-loop thread (an index's catch-up); the rest go
to the worker thread, so a filter that scans far never holds the loop for long."""


class SqliteLog(LogStore):
    """An append-only log in one SQLite database, safe for many processes appending at once."""

    def __init__(
        self, path: Path, conn: sqlite3.Connection, reader: sqlite3.Connection | None = None
    ) -> None:
        self.path = path
        self.url = f"sqlite:{path}"
        self._db = conn
        self._reader = reader
        """The read-only connection the event-loop thread reads on (None: every read goes to the worker thread)."""
        self._limiter = anyio.CapacityLimiter(1)
        self._group = GroupCommitter(self._commit, self._commit_now)
        self._users = RecentUsers()  # other tasks on the store now: commits go to the worker thread
        self._closed = False
        self._in_flight = 0  # calls on (or queued for) the worker thread; inline commits need it idle
        self._waits = (
            True  # the connection's busy timeout is busy_timeout_ms (False: 0, for an inline commit)
        )
        self._busy_timeout_ms = BUSY_TIMEOUT_MS
        self._attempt_s = 0.0  # how long the last call on the worker thread took
        self._heads = (
            sqlite_fast.Heads()
        )  # the head this connection last wrote: lone appends skip the look-up

    @property
    def busy_timeout_ms(self) -> int:
        """How long a call waits for another process's write lock before it fails (``LockTimeoutError``).

        A long-running engine lowers it to its lease: a write that waits out the lease is lost anyway, and the
        engine must say that it waits, not hang silently in SQLite's busy handler.
        """
        return self._busy_timeout_ms

    @busy_timeout_ms.setter
    def busy_timeout_ms(self, value: int) -> None:
        self._busy_timeout_ms = value
        self._waits = False  # the next call on the worker thread sets it on the connection

    @classmethod
    async def open(cls, path: Path, *, synchronous: str = "FULL", create: bool = True) -> SqliteLog:
        """Open the log at ``path``; with ``create``, make an empty or missing database a new log.

        :raises UsageError: for an unknown ``synchronous`` level.
        :raises LogNotFoundError: without ``create``, when there is no log at ``path``.
        :raises NotALogError: when the file is another application's database or no database at all.
        :raises StoreUnavailableError: when the file cannot be opened.
        """
        level = synchronous.upper()
        if level not in SYNCHRONOUS:
            raise UsageError(
                f"unknown synchronous level {synchronous!r}: use one of {', '.join(SYNCHRONOUS)}"
            )
        prepare_path(path, create=create)
        try:
            if create:
                create_private(path)  # before SQLite creates it (and its -wal and -shm, which copy its mode)
            conn = sqlite3.connect(
                path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False
            )
        except (OSError, sqlite3.Error) as e:
            raise StoreUnavailableError(f"cannot open {path}: {e}; check --store and permissions") from e
        store = cls(path, conn)
        try:
            await store._run(ops.setup, str(path), level, create)
        except BaseException:
            conn.close()
            store._closed = True
            raise
        conn.execute(f"PRAGMA busy_timeout = {WAIT_SLICE_MS}")  # setup waited whole; from now on, in slices
        store._reader = _open_reader(path)
        return store

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(connection, *args)`` on the worker thread: one hand-off, errors translated."""
        if self._closed:
            raise StorageError(f"{self.url} is closed; open the store again")
        self._in_flight += 1
        waited = 0.0  # time spent waiting for the lock itself (not queued behind this store's other calls)
        try:
            while True:
                try:
                    return await anyio.to_thread.run_sync(self._waiting, fn, args, limiter=self._limiter)
                except sqlite3.OperationalError as e:  # busy: nothing written; again, unless waited enough
                    took = self._attempt_s
                    waited += took
                    slice_s = min(self._busy_timeout_ms, WAIT_SLICE_MS) / 1000
                    declined = took < slice_s / 2  # SQLite did not wait (recovering a WAL): said at once
                    if not ops.is_busy(e) or declined or waited * 1000 >= self._busy_timeout_ms:
                        raise
                await anyio.lowlevel.checkpoint()  # a cancelled caller stops here, between two slices
        except LoopdError:
            raise
        except sqlite3.Error as e:
            raise ops.translate(e, str(self.path), waited, self._busy_timeout_ms) from e
        finally:
            self._in_flight -= 1

    def _waiting(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        """On the worker thread: restore the busy timeout (one slice) an inline commit lowered, then run ``fn``;
        an attempt refused as busy leaves no transaction open, so it can be made again."""
        if not self._waits:
            self._db.execute(f"PRAGMA busy_timeout = {min(self._busy_timeout_ms, WAIT_SLICE_MS)}")
            self._waits = True
        started = time.monotonic()
        try:
            return fn(self._db, *args)
        except sqlite3.OperationalError as e:
            if ops.is_busy(e) and self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise
        finally:
            self._attempt_s = time.monotonic() - started  # one call at a time on this thread (the limiter)

    def _read_now(self, fn: Callable[..., T], *args: Any) -> T | None:
        """``fn(reader, *args)`` on the event-loop thread; None, having read nothing, when it must run on the
        worker thread (no reader, or SQLite refused the reader for now)."""
        if self._closed:
            raise StorageError(f"{self.url} is closed; open the store again")
        return None if self._reader is None else self._now(fn, self._reader, *args)

    def _now(self, fn: Callable[..., T], conn: sqlite3.Connection, *args: Any) -> T | None:
        """``fn(conn, *args)`` on the event-loop thread; None when SQLite answered busy (nothing was done)."""
        try:
            return fn(conn, *args)
        except sqlite3.OperationalError as e:
            if not ops.is_busy(e):
                raise ops.translate(e, str(self.path), None) from e
            return None
        except sqlite3.Error as e:
            raise ops.translate(e, str(self.path), None) from e

    async def _read(self, fn: Callable[..., T], *args: Any) -> T:
        """A short read: on the event-loop thread (:meth:`_read_now`) when it can, else on the worker thread."""
        self._users.note()
        await anyio.lowlevel.checkpoint()
        found = self._read_now(fn, *args)
        return found if found is not None else await self._run(fn, *args)

    def _commit_now(self, group: list[Request]) -> bool:
        """Commit on the event-loop thread when the connection is idle and the write lock is free.

        Returns False, having written nothing, when the commit must wait (another call on the connection,
        or another process holding the write lock) or is a group of several requests: :meth:`_commit` then
        runs it on the worker thread.
        """
        if self._closed:
            raise StorageError(f"{self.url} is closed; open the store again")
        conn = self._db
        # a lone group is its leader's own request, so its noted task is the current one (no look-up)
        if self._in_flight or len(group) > 1 or self._users.others(group[0].task):
            return False
        if self._waits:  # lowered once for a run of inline commits; every thread call restores it first
            conn.execute("PRAGMA busy_timeout = 0")
            self._waits = False
        return self._now(sqlite_fast.commit, conn, group, self._heads) is not None

    async def _commit(self, group: list[Request]) -> None:
        """Commit on the worker thread, waiting out another writer's lock (the busy timeout)."""
        await self._run(sqlite_fast.commit, group, self._heads)

    # -- writing ------------------------------------------------------------------------------------

    async def _submit(self, request: Request) -> list[Envelope]:
        request.task = self._users.note()
        return await self._group.submit(request)

    # -- reading ------------------------------------------------------------------------------------

    async def read_batches(
        self,
        *,
        from_position: int = 1,
        limit: int | None = None,
        stream: str | None = None,
        from_version: int = 1,
    ) -> AsyncIterator[list[Envelope]]:
        async for batch in self._select(
            from_position, limit, stream, from_version, None, None, reads.read_rows
        ):
            yield batch

    async def read_for_copy(self) -> AsyncIterator[list[Envelope]]:
        """Every row with its checksum recomputed (a CRC-32 per row, no payload decoded), in global order."""
        checked = await self._read(ops.check_log, self.url) is True
        read = functools.partial(reads.read_checked, where=self.url, checked=checked)
        async for batch in in_order(self.url, self._select(1, None, None, 1, None, None, read)):
            yield batch

    async def read_recorded(
        self,
        *,
        from_position: int = 1,
        limit: int | None = None,
        stream: str | None = None,
        from_version: int = 1,
    ) -> AsyncIterator[list[Recorded]]:
        async for batch in self._select(
            from_position, limit, stream, from_version, None, None, reads.read_recorded
        ):
            yield batch

    def read_stream_rows(
        self, stream: str, *, from_version: int = 1, until_position: int | None = None
    ) -> AsyncIterator[StreamRows]:
        """Read on the event-loop thread a batch at a time, as :meth:`_select` reads one stream."""
        until = MAX_POSITION if until_position is None else until_position

        async def read(after: int) -> StreamRows | None:
            await anyio.lowlevel.checkpoint()
            self._users.note()
            args = (str(self.path), stream, after, READ_BATCH, until)
            found = self._read_now(reads.read_stream_rows, *args)
            (batch,) = found if found is not None else await self._run(reads.read_stream_rows, *args)
            return batch

        return stream_rows_batches(read, from_version)

    async def read_log_rows(
        self, *, rows_prefix: str, until_position: int | None = None
    ) -> AsyncIterator[LogRows]:
        """Read on the event-loop thread a position range at a time (as :meth:`_select` reads the whole log),
        up to the head as it was when the read began; then each row stream's last place, in one statement."""
        low, high = prefix_bounds(rows_prefix)
        end = await self._read(reads.head)
        if until_position is not None:
            end = min(end, max(until_position, 0))
        any_rows = False
        for after in range(0, end, READ_BATCH):
            args = (low, high, after, min(after + READ_BATCH, end))
            self._users.note()
            await anyio.lowlevel.checkpoint()
            found = self._read_now(reads.read_log_rows, *args)
            rows, recorded = found if found is not None else await self._run(reads.read_log_rows, *args)
            any_rows = any_rows or bool(rows)
            yield LogRows(rows, recorded)
        if any_rows:
            yield LogRows([], [], await self._read(reads.last_places, low, high, end))

    async def read_filtered(
        self,
        *,
        from_position: int = 1,
        limit: int | None = None,
        types: Sequence[str] | None = None,
        stream_prefix: str | None = None,
    ) -> AsyncIterator[list[Envelope]]:
        async for batch in self._select(from_position, limit, None, 1, types, stream_prefix, reads.read_rows):
            yield batch

    async def _select(
        self,
        from_position: int,
        limit: int | None,
        stream: str | None,
        from_version: int,
        types: Sequence[str] | None,
        prefix: str | None,
        read: Callable[..., list[R]],
    ) -> AsyncIterator[list[R]]:
        """Bounded batches of rows (:func:`~.sqlite_reads.read_rows`, or ``read``'s), filtered by SQLite.

        A read whose every row is found through an index (one stream by version, or the whole log by
        position) runs on the event-loop thread a :data:`READ_BATCH` at a time (about 5 ms on the 2-core
        benchmark machine), yielding to other tasks between batches: on the worker thread the same rows cost a
        hand-off each way, and building their Python objects needs the GIL, so the loop waited for it anyway
        (docs/performance.md, run 8). A type or prefix filter can scan many rows per row it keeps, so such a
        read fetches its first :data:`INLINE_ROWS` here and the rest on the worker thread.
        """
        remaining = limit if limit is not None else -1
        after = max(from_position, 1) - 1 if stream is None else max(from_version, 1) - 1
        kinds = None if types is None else list(types)
        scans = types is not None or prefix is not None
        inline = INLINE_ROWS if scans else READ_BATCH
        while remaining != 0:
            batch: list[R] | None = None
            if inline:
                size = inline if remaining < 0 else min(inline, remaining)
                self._users.note()
                await anyio.lowlevel.checkpoint()
                batch = self._read_now(read, stream, after, size, kinds, prefix)
                if scans:
                    inline = 0
            if batch is None:
                size = READ_BATCH if remaining < 0 else min(READ_BATCH, remaining)
                batch = await self._run(read, stream, after, size, kinds, prefix)
            if not batch:
                return
            yield batch
            if len(batch) < size:
                return
            after = batch[-1].position if stream is None else batch[-1].version
            if remaining > 0:
                remaining -= len(batch)
            if not inline:
                await anyio.lowlevel.checkpoint()

    async def coord_read(self, prefix: str = "") -> list[Claim]:
        """Read on the event-loop thread when the connection is idle (a key look-up costs less than the
        thread hand-off; the engine checks its lease before every side effect), else on the worker thread."""
        return await self._read(sqlite_coord.read, prefix)

    async def coord_swap(self, key: str, expected_token: int, new: Claim | None) -> Claim | None:
        check_swap(key, expected_token, new)
        return await self._run(sqlite_coord.swap, key, expected_token, new)

    async def head(self) -> int:
        return await self._read(reads.head)

    async def stream_version(self, stream: str) -> int:
        return await self._read(ops.stream_version, stream)

    async def streams(self) -> list[str]:
        return await self._run(reads.streams)

    async def verify(self, *, repair: bool = False) -> VerifyReport:
        report = VerifyReport(self.url)
        await self._run(ops.verify, report)
        if repair and not report.ok:
            report.repaired.append("SQLite logs are repaired by SQLite itself; nothing to truncate")
        return report

    async def import_envelopes(self, batches: AsyncIterator[list[Envelope]]) -> int:
        self._heads.forget()
        await self._run(sqlite_import.begin_import, self.url)
        checker = SequenceChecker(self.url)
        try:
            async for batch in batches:
                for env in batch:
                    checker.check(env)
                await self._run(sqlite_import.insert_verbatim, batch)
            await self._run(sqlite_import.finish_import)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._run(ops.rollback)
            raise
        return checker.position

    async def aclose(self) -> None:
        if self._closed:
            return
        with anyio.CancelScope(shield=True):
            async with self._limiter:  # after any call still running on the worker thread
                self._closed = True
                self._db.close()
                if self._reader is not None:
                    self._reader.close()


def _open_reader(path: Path) -> sqlite3.Connection | None:
    """A second connection for reads on the event-loop thread: query-only, never waiting (busy timeout 0).

    None when it cannot be opened: every read then goes to the worker thread, as it would without it.
    """
    try:
        reader = sqlite3.connect(path, isolation_level=None, timeout=0, check_same_thread=False)
        reader.execute("PRAGMA query_only = 1")
    except sqlite3.Error:
        return None
    return reader
