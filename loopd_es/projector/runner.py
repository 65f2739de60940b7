"""The projector: catch up on the log, then follow it, applying every projection in batches.

One loop serves history and live events alike: read from the lowest checkpoint, apply each batch in one
transaction on the read database (one thread hop per batch), repeat until the log has nothing more; in
follow mode, sleep until watchfiles (or the slow poll) says the log changed and do it again. The watcher
starts *before* the first catch-up, so an append made while catching up wakes the next round: there is no
seam between history and live.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Self, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread

from ..errors import StoreUnavailableError
from . import parallel as parallel_rebuild
from .base import Projection, ProjectionError, UnknownProjectionError, check_registry
from .readdb import BatchResult, ProjectionStatus, ReadDb
from .watch import SETTLE_DELAYS, Waker, WatchFactory, default_read_db, log_files, watch_commits, watch_log

if TYPE_CHECKING:
    from ..events.envelope import Envelope
    from ..log import LogStore

log = logging.getLogger("loopd_es.projector")

T = TypeVar("T")

Progress = Callable[[int, int], None]
"""Called after each committed batch with (position reached, log head at the start of the catch-up)."""

REBUILD_EVENTS: Final = 32_768
"""Events per transaction in a rebuild: the store's read batches are joined up to this many. Each transaction
costs a fold load and save per goal and an upsert per (stream, type): fewer, bigger ones make a rebuild ~15%
cheaper in CPU. A catch-up keeps one transaction per read batch (a crash loses less, progress is finer)."""


async def _coalesced(batches: AsyncIterator[list[Envelope]], size: int) -> AsyncIterator[list[Envelope]]:
    """The store's batches joined into lists of at least ``size`` events (the last one may be shorter)."""
    pending: list[Envelope] = []
    async for batch in batches:
        pending.extend(batch)
        if len(pending) >= size:
            yield pending
            pending = []
    if pending:
        yield pending


def _file_of(path: Path) -> tuple[int, int] | None:
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return None
    return found.st_dev, found.st_ino


class Projector:
    """Keeps a read database up to date with a log. Use ``async with await Projector.open(...)``."""

    def __init__(self, store: LogStore, db: ReadDb) -> None:
        self.store = store
        self.db = db
        self.read_db = db.path
        self.on_commit: Callable[[BatchResult, float], None] | None = None
        """Test and benchmark hook: called after each commit with the result and ``time.monotonic()``."""
        self._limiter = anyio.CapacityLimiter(1)
        self._next = 1  # the first position some projection still needs
        self._log_checked = False
        self._file: tuple[int, int] | None = None  # the read database file followed: (device, inode)

    @classmethod
    async def open(
        cls, store: LogStore, projections: Sequence[Projection], read_db: str | Path | None = None
    ) -> Projector:
        """Open (or create) the read database for ``store``; ``read_db`` defaults to ``read.db`` beside the log.

        Projections whose ``version`` changed since the read database last saw them are reset here and
        rebuilt by the next catch-up.

        :raises UsageError: for a registry with duplicate names or bad versions.
        :raises ProjectionError: when the read database cannot be opened or set up.
        """
        check_registry(projections)
        path = Path(read_db) if read_db is not None else default_read_db(store.url)
        self = cls(store, ReadDb(path, projections))
        await self._set_up()
        return self

    async def _set_up(self) -> None:
        db = self.db
        try:
            reset = await self._call(db.setup)
            for name in reset:
                log.warning("projection %r changed version; rebuilding it from the log", name)
            self._next = min((await self._call(db.checkpoints)).values(), default=0) + 1
            self._file = _file_of(db.path)
            self._log_checked = False
        except BaseException:
            db.close()
            raise

    async def _follow_the_file(self) -> None:
        """A follower whose read database was deleted or replaced (``rm``, a restore) went on writing to the
        unlinked file, and no query saw it again: open the one at its path now, and catch it up."""
        if _file_of(self.db.path) == self._file:
            return
        log.warning("the read database %s was removed or replaced; following the one there now", self.db.path)
        await self._call(self.db.close)
        self.db = ReadDb(self.db.path, self.db.projections)
        await self._set_up()

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """One hop to the database thread; the limiter keeps calls on the connection strictly one at a time."""
        return await anyio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            await self._call(self.db.close)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # -- catching up ----------------------------------------------------------------------------------

    async def checkpoints(self) -> dict[str, int]:
        """Each registered projection's checkpoint."""
        return await self._call(self.db.checkpoints)

    async def run_once(
        self, progress: Progress | None = None, names: Collection[str] | None = None, *, join: int = 0
    ) -> int:
        """Apply everything the log holds now to every projection; returns the number of events applied.

        Counts an event once per projection that applied it; parked events are not counted. With ``names``,
        only those projections move (a parallel rebuild builds the others elsewhere meanwhile). With ``join``,
        the store's read batches are joined into transactions of at least that many events (rebuilds).

        :raises ProjectionError: when the read database fails, or was built from another log.
        :raises CorruptLogError: when the log cannot be read.
        """
        if not self._log_checked:
            await self._check_log()
        head = await self.store.head() if progress is not None else 0
        applied = 0
        while True:
            start, again = self._next, False
            batches = self.store.read_batches(from_position=start)
            try:
                async for batch in _coalesced(batches, join) if join > 1 else batches:
                    result = await self._call(self.db.apply_batch, batch, names)
                    if self.on_commit is not None:
                        self.on_commit(result, time.monotonic())
                    applied += result.applied
                    self._next = result.low + 1
                    if progress is not None:
                        progress(batch[-1].position, head)
                    if self._next <= batch[0].position:
                        again = True  # a projection was reset meanwhile: read again from its checkpoint
                        break
            finally:
                close = getattr(batches, "aclose", None)
                if close is not None:
                    await close()
            if not again:
                return applied

    async def _check_log(self) -> None:
        """Refuse to mix logs (the read db remembers the log's first event id) or to run ahead of one."""
        first = None
        async for batch in self.store.read_batches(limit=1):
            first = batch[0].event_id
        recorded = await self._call(self.db.log_id)
        if recorded is not None and first != recorded:
            raise ProjectionError(
                f"the read database {self.read_db} was built from another log (first event {recorded}, "
                f"{self.store.url} starts with {first}); use another --read-db or `loopd-es projections rebuild`"
            )
        ahead = max((await self._call(self.db.checkpoints)).values(), default=0)
        head = await self.store.head()
        if ahead > head:
            raise ProjectionError(
                f"the read database {self.read_db} is at position {ahead} but {self.store.url} ends at {head}; "
                "was the log replaced by an older copy? run `loopd-es projections rebuild`"
            )
        if first is not None and recorded is None:
            await self._call(self.db.set_log_id, first)
        self._log_checked = first is not None

    # -- following ------------------------------------------------------------------------------------

    async def follow(
        self,
        *,
        poll_interval: float = 1.0,
        debounce: int = 0,
        step: int = 1,
        progress: Progress | None = None,
        awatch: WatchFactory | None = None,
    ) -> None:
        """Catch up, then apply new events as they are appended, until cancelled.

        ``debounce``/``step`` are watchfiles' (milliseconds); ``poll_interval`` (seconds) is the safety net
        when no file event arrives. Stop it by cancelling an enclosing cancel scope; it returns within
        about ``step`` ms and leaves nothing half-applied.
        """
        waker = Waker()
        stop = anyio.Event()
        files = log_files(self.store.url)
        commits = getattr(self.store, "commits", None)  # a database server that notifies its followers
        async with anyio.create_task_group() as tg:
            if commits is not None:
                tg.start_soon(watch_commits, commits(), waker)
            else:
                tg.start_soon(
                    lambda: watch_log(files, waker, stop, debounce=debounce, step=step, awatch=awatch)
                )
            # On asyncio the new task runs first, up to awatch's first thread hop, by which point its inotify
            # watches exist: an append made during the catch-up below then wakes the next round.
            await anyio.lowlevel.checkpoint()
            try:
                await self.run_once(progress)  # a log out of reach at the start is the caller's error
                settle = len(SETTLE_DELAYS)
                out_of_reach = False
                while True:
                    timeout = SETTLE_DELAYS[settle] if settle < len(SETTLE_DELAYS) else poll_interval
                    woken = await waker.wait(timeout)
                    try:
                        await self._follow_the_file()
                        await self.run_once()
                    except StoreUnavailableError as e:  # a database server gone for a while: wait it out
                        if not out_of_reach:
                            log.warning("%s; the read models catch up once the log is back", e)
                        out_of_reach, settle = True, len(SETTLE_DELAYS)
                        continue
                    if out_of_reach:
                        log.warning("the log is back: the read models caught up")
                        out_of_reach = False
                    settle = 0 if woken else min(settle + 1, len(SETTLE_DELAYS))
            finally:
                stop.set()

    # -- maintenance ----------------------------------------------------------------------------------

    def names(self, name: str | None) -> list[str]:
        """``[name]`` after checking it is registered, or every registered name.

        :raises UnknownProjectionError: for an unregistered name.
        """
        known = [p.name for p in self.db.projections]
        if name is None:
            return known
        if name not in known:
            raise UnknownProjectionError(name, known)
        return [name]

    async def rebuild(
        self, name: str | None = None, progress: Progress | None = None, *, parallel: bool | None = None
    ) -> int:
        """Drop the named projection (all when None) and rebuild it from the whole log; returns events applied.

        Several projections over a log of :data:`~.parallel.PARALLEL_MIN_EVENTS` or more (or with
        ``parallel=True``) are rebuilt on two cores (:mod:`.parallel`); ``parallel=False`` keeps one process.
        ``progress`` then follows this process's share.

        :raises UnknownProjectionError: for an unregistered name.
        """
        with parallel_rebuild.relaxed_gc():
            return await self._rebuild(self.names(name), name is None, progress, parallel)

    async def _rebuild(
        self, names: list[str], everything: bool, progress: Progress | None, parallel: bool | None
    ) -> int:
        await self._call(self.db.reset, names)
        if everything:
            await self._call(self.db.set_log_id, None)  # a full rebuild may follow a different log
            self._log_checked = False
        self._next = 1
        shares = await self._parallel_shares(names, parallel)
        if shares is None:
            return await self.run_once(progress, join=REBUILD_EVENTS)
        here, there = shares
        if not self._log_checked:
            await self._check_log()
        part = parallel_rebuild.part_path(self.read_db)
        done: list[tuple[dict[str, int], int]] = []

        async def worker() -> None:
            done.append(await parallel_rebuild.run_part(self.store.url, there, part))

        try:
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(worker)
                    applied = await self.run_once(progress, [p.name for p in here], join=REBUILD_EVENTS)
            except BaseExceptionGroup as group:  # the first failure, as one process would raise it
                raise group.exceptions[0] from None
            checkpoints, applied_there = done[0]
            await self._call(self.db.adopt, part, checkpoints)
        finally:
            parallel_rebuild.remove_db(part)
        self._next = min((await self.checkpoints()).values(), default=0) + 1
        return applied + applied_there + await self.run_once()  # what was appended meanwhile, for all

    async def _parallel_shares(
        self, names: Sequence[str], parallel: bool | None
    ) -> tuple[list[Projection], list[Projection]] | None:
        if (
            parallel is False
            or len(names) < 2
            or not self.store.url.startswith(parallel_rebuild.PARALLEL_SCHEMES)
        ):
            return None
        if parallel is None and (
            (os.cpu_count() or 1) < 2 or await self.store.head() < parallel_rebuild.PARALLEL_MIN_EVENTS
        ):
            return None
        shares = parallel_rebuild.split([self.db.by_name[n] for n in names])
        if shares is not None and not parallel_rebuild.portable(shares[1]):
            log.info("rebuilding in one process: a projection cannot be sent to a worker process")
            return None
        return shares

    async def retry(self, name: str | None = None) -> tuple[int, int]:
        """Re-apply parked events (of one projection, or all); returns (applied now, still parked).

        A retried event is applied *after* the later events its projection already applied: retry helps
        when the cause was outside the event (a bug fixed in the projection, a missing row since added).
        """
        return await self._call(self.db.retry, self.names(name))

    async def status(self) -> tuple[int, list[ProjectionStatus]]:
        """The log head and each projection's checkpoint and parked events."""
        head = await self.store.head()
        return head, await self._call(self.db.status)


async def rebuild_part(url: str, projections: Sequence[Projection], path: Path) -> tuple[dict[str, int], int]:
    """In the worker process of a parallel rebuild: build ``projections`` from the log at ``url`` into a fresh
    read db at ``path``; returns each one's checkpoint and the (projection, event) pairs applied."""
    from ..log import open_store

    parallel_rebuild.remove_db(path)
    async with await open_store(url, create=False) as store:
        async with await Projector.open(store, projections, path) as projector:
            with parallel_rebuild.relaxed_gc():
                applied = await projector.run_once(join=REBUILD_EVENTS)
            return await projector.checkpoints(), applied
