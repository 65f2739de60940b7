"""A read-only view of an SQLite log whose calls never suspend, for one-shot queries run without an event loop.

A one-shot query (``read --limit 1``, ``goals``, ``history``) spends most of its start-up importing asyncio
and anyio, not reading (``docs/performance.md``, CLI start-up). :class:`SqliteSnapshot` keeps the
:class:`~.base.LogStore` contract for reading on one read-only connection and does every call inline, so the
command's ordinary coroutine can be driven to its end without a loop (``cli/loopless.py``). Every write is
refused. Whatever it cannot answer as the full store would (no log yet, a file SQLite will not open read-only)
raises :class:`~.base.NeedsEventLoop` before anything is read, and the command runs again on the full store.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from ..errors import LoopdError, StorageError, UsageError
from . import sqlite_coord
from . import sqlite_ops as ops
from . import sqlite_reads as reads
from .base import READ_BATCH, LogStore, NeedsEventLoop
from .invariants import VerifyReport

if TYPE_CHECKING:
    from ..events.envelope import Envelope
    from .coord import Claim
    from .group_commit import Request

T = TypeVar("T")


class ReadOnlySnapshotError(UsageError):
    """A write was asked of a snapshot: a command marked loopless must only read."""


class SqliteSnapshot(LogStore):
    """One read-only connection on an SQLite log; each call runs inline and never awaits anything."""

    loopless: ClassVar[bool] = True

    def __init__(self, path: Path, conn: sqlite3.Connection) -> None:
        self.path = path
        self.url = f"sqlite:{path}"
        self._db: sqlite3.Connection | None = conn

    @classmethod
    def open(cls, path: Path) -> SqliteSnapshot:
        """Open the log at ``path`` read-only (never creating or changing a file).

        :raises NeedsEventLoop: when there is no log at ``path`` or SQLite will not open it read-only: the full
            store then says why, in its own words.
        :raises NotALogError: when the file is another application's database.
        """
        if not path.is_file():
            raise NeedsEventLoop(f"no log file at {path}")
        try:
            conn = sqlite3.connect(
                f"{path.absolute().as_uri()}?mode=ro",
                uri=True,
                isolation_level=None,
                timeout=ops.BUSY_TIMEOUT_MS / 1000,
            )
        except sqlite3.Error as e:
            raise NeedsEventLoop(f"cannot open {path} read-only: {e}") from e
        try:
            if ops.check_log(conn, str(path)) is False:  # None (a log from before checksums) reads as well
                raise NeedsEventLoop(f"{path} holds no log yet")
        except sqlite3.Error as e:
            conn.close()
            raise NeedsEventLoop(f"cannot read {path} read-only: {e}") from e
        except BaseException:
            conn.close()
            raise
        return cls(path, conn)

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        if self._db is None:
            raise StorageError(f"{self.url} is closed; open the store again")
        try:
            return fn(self._db, *args)
        except LoopdError:
            raise
        except sqlite3.Error as e:
            raise ops.translate(e, str(self.path), None) from e

    # -- reading --------------------------------------------------------------------------------------

    async def read_batches(
        self,
        *,
        from_position: int = 1,
        limit: int | None = None,
        stream: str | None = None,
        from_version: int = 1,
    ) -> AsyncIterator[list[Envelope]]:
        for batch in self._select(from_position, limit, stream, from_version, None, None):
            yield batch

    async def read_filtered(
        self,
        *,
        from_position: int = 1,
        limit: int | None = None,
        types: Sequence[str] | None = None,
        stream_prefix: str | None = None,
    ) -> AsyncIterator[list[Envelope]]:
        for batch in self._select(from_position, limit, None, 1, types, stream_prefix):
            yield batch

    def _select(
        self,
        from_position: int,
        limit: int | None,
        stream: str | None,
        from_version: int,
        types: Sequence[str] | None,
        prefix: str | None,
    ) -> Iterator[list[Envelope]]:
        """Bounded batches of rows filtered by SQLite, as :class:`~.sqlite.SqliteLog` reads them."""
        remaining = limit if limit is not None else -1
        after = max(from_position, 1) - 1 if stream is None else max(from_version, 1) - 1
        kinds = None if types is None else list(types)
        while remaining != 0:
            size = READ_BATCH if remaining < 0 else min(READ_BATCH, remaining)
            batch = self._call(reads.read_rows, stream, after, size, kinds, prefix)
            if not batch:
                return
            yield batch
            if len(batch) < size:
                return
            after = batch[-1].position if stream is None else batch[-1].version
            if remaining > 0:
                remaining -= len(batch)

    async def head(self) -> int:
        return self._call(reads.head)

    async def stream_version(self, stream: str) -> int:
        return self._call(ops.stream_version, stream)

    async def streams(self) -> list[str]:
        return self._call(reads.streams)

    async def coord_read(self, prefix: str = "") -> list[Claim]:
        return self._call(sqlite_coord.read, prefix)

    async def verify(self, *, repair: bool = False) -> VerifyReport:
        if repair:
            raise ReadOnlySnapshotError(f"{self.url} is open read-only here: it cannot be repaired")
        report = VerifyReport(self.url)
        self._call(ops.verify, report)
        return report

    # -- refused --------------------------------------------------------------------------------------

    async def _submit(self, request: Request) -> list[Envelope]:
        raise ReadOnlySnapshotError(f"{self.url} is open read-only here: it cannot append events")

    async def coord_swap(self, key: str, expected_token: int, new: Claim | None) -> Claim | None:
        raise ReadOnlySnapshotError(f"{self.url} is open read-only here: it cannot take a lease or claim")

    async def import_envelopes(self, batches: AsyncIterator[list[Envelope]]) -> int:
        raise ReadOnlySnapshotError(f"{self.url} is open read-only here: it cannot import")

    async def aclose(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
