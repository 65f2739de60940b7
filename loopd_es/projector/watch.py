"""Waking the projector when the log changes: watchfiles on the log's files, a slow poll as a safety net.

Which files tell us another process appended:

- NDJSON: the log file (the data) and its ``.lock`` file, because a writer clears its in-flight record there
  only *after* the data is synced, and readers do not see the data before that; the ``.idx`` is written last.
- SQLite: the database and its ``-wal``. A commit becomes visible to readers only when SQLite updates
  its shared-memory index (``-shm``, written through ``mmap``, which inotify never reports), a moment
  after the ``-wal`` write that woke us.

Both mean a wake-up can arrive a little *before* the event is readable, so after a wake-up the runner looks
again a few times over the next ~30 ms (:data:`SETTLE_DELAYS`) instead of going back to sleep.

watchfiles' defaults (``debounce=1600, step=50``) cost about 100 ms per wake-up; ``debounce=0, step=1``
wakes in about 3 ms. ``force_polling`` loses wake-ups, so it is never used: the slow poll covers a
watcher that fails (inotify limits, a network file system).
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Final

import anyio

from ..log import POSTGRES_SCHEMES, parse_store_url
from .paths import default_read_db as default_read_db  # re-exported: the runner takes it from here

log = logging.getLogger("loopd_es.projector")

SETTLE_DELAYS: Final = (0.001, 0.002, 0.004, 0.008, 0.016)
"""Seconds between the extra looks after a wake-up (about 31 ms in all)."""

WatchFactory = Callable[..., AsyncIterator[Any]]
"""``watchfiles.awatch`` or a test double with the same call signature."""


def log_files(store_url: str) -> list[Path]:
    """The files whose changes mean new events may be readable in the log at ``store_url``.

    None for a database server: its store wakes followers itself (:meth:`PostgresLog.commits`).
    """
    if store_url.startswith(POSTGRES_SCHEMES):
        return []
    scheme, path, _ = parse_store_url(store_url)
    main = Path(path).absolute()
    if scheme == "ndjson":
        return [main, main.with_name(main.name + ".lock"), main.with_name(main.name + ".idx")]
    return [main, main.with_name(main.name + "-wal")]


class Waker:
    """A level-triggered wake-up flag: wakes that arrive while the projector works are not lost."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    def wake(self) -> None:
        self._event.set()

    async def wait(self, seconds: float) -> bool:
        """Wait up to ``seconds``; True when woken (and the flag is then cleared), False on timeout."""
        with anyio.move_on_after(seconds):
            await self._event.wait()
        woken = self._event.is_set()
        if woken:
            self._event = anyio.Event()
        return woken


async def watch_commits(commits: AsyncIterator[int], waker: Waker) -> None:
    """Wake ``waker`` on every commit a database server reports, until cancelled."""
    async for _head in commits:
        waker.wake()


async def watch_log(
    files: list[Path],
    waker: Waker,
    stop: anyio.Event,
    *,
    debounce: int,
    step: int,
    awatch: WatchFactory | None = None,
) -> None:
    """Wake ``waker`` on every change to ``files`` until ``stop`` is set; on a watcher failure, log and return.

    The directory is watched rather than the files, because ``-wal`` and ``.lock`` files come and go.
    ``stop`` is passed to watchfiles so that cancelling ends its thread within ``step`` ms, rather than at
    its next internal timeout.
    """
    if awatch is None:
        from watchfiles import awatch as awatch_

        awatch = awatch_
    names = {f.name for f in files}
    directories = sorted({str(f.parent) for f in files})

    def only_log_files(_change: Any, path: str) -> bool:
        return os.path.basename(path) in names

    try:
        async for _changes in awatch(
            *directories,
            watch_filter=only_log_files,
            debounce=debounce,
            step=step,
            stop_event=stop,
            recursive=False,
            rust_timeout=60_000,
        ):
            waker.wake()
    except anyio.get_cancelled_exc_class():
        raise
    except Exception as e:  # the poll keeps the projector going; say why it is slower
        log.warning("watching %s failed (%s: %s); falling back to polling", directories, type(e).__name__, e)
