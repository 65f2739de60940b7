"""Follow mode against a scripted watcher: file events drive it, the poll backs it up, cancelling stops it."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import anyio
import pytest

from loopd_es.events.envelope import NewEvent
from loopd_es.projector import Projector
from tests.waits import alet_time_pass, await_until

from .test_projector_base import Recorder, checkpoints, dump, fill, store

if TYPE_CHECKING:
    from loopd_es.log import LogStore

pytestmark = pytest.mark.anyio
__all__ = ("store",)


class FakeWatcher:
    """Stands in for ``watchfiles.awatch``: yields a change set whenever the test calls ``touch``."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.kwargs: dict[str, Any] = {}
        self.paths: tuple[str, ...] = ()
        self.running = False
        self._send, self._receive = anyio.create_memory_object_stream[set[tuple[int, str]]](100)

    def touch(self, path: str) -> None:
        self._send.send_nowait({(2, path)})  # 2 is watchfiles' Change.modified

    async def __call__(self, *paths: str, **kwargs: Any) -> AsyncIterator[set[tuple[int, str]]]:
        self.paths, self.kwargs, self.running = paths, kwargs, True
        if self.fail:
            self.close()
            raise OSError(28, "inotify watch limit reached")
        keep: Callable[[Any, str], bool] = kwargs["watch_filter"]
        try:
            async for changes in self._receive:
                kept = {c for c in changes if keep(c[0], c[1])}
                if kept:
                    yield kept
        finally:
            self.running = False
            self.close()

    def close(self) -> None:
        self._send.close()
        self._receive.close()


POLL: Final = 60.0
"""The follower's safety-net poll: a change seen well before it (a sixth) came from a wake-up."""
SETTLED: Final = 0.5
"""Far longer than the settle looks after a wake-up (SETTLE_DELAYS, ~30 ms in all)."""


def _log_file(store: LogStore) -> str:
    return str(Path(store.url.split(":", 1)[1]).absolute())


async def test_a_file_event_wakes_the_projector_and_others_are_ignored(
    store: LogStore, tmp_path: Path
) -> None:
    await fill(store, 20)
    read_db = tmp_path / "read.db"
    watcher = FakeWatcher()
    async with (
        await Projector.open(store, [Recorder()], read_db) as projector,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(lambda: projector.follow(poll_interval=POLL, awatch=watcher))
        await await_until("the history to be projected", lambda: checkpoints(read_db)["recorder"] == 20)
        assert watcher.kwargs["debounce"] == 0 and watcher.kwargs["step"] == 1
        assert watcher.kwargs["recursive"] is False and watcher.paths == (
            str(tmp_path),
        )  # tmp_path is absolute
        await alet_time_pass(SETTLED, "the settle looks after start-up are over: only a wake-up can help now")

        await store.append("s-new", [NewEvent(type="test.live")])
        watcher.touch(str(read_db))  # the read db sits in the same directory: not a reason to look
        await alet_time_pass(SETTLED, "a look, were the read db's change taken for a wake-up, is over")
        assert checkpoints(read_db)["recorder"] == 20
        watcher.touch(_log_file(store))
        await await_until(
            "the wake-up to project the event",
            lambda: checkpoints(read_db)["recorder"] == 21,
            within=POLL / 6,
        )
        tg.cancel_scope.cancel()
    assert not watcher.running


async def test_a_wake_up_before_the_event_is_readable_is_followed_by_a_second_look(
    store: LogStore, tmp_path: Path
) -> None:
    """SQLite publishes a commit in its -shm after the -wal write that woke us; inotify never sees that."""
    read_db = tmp_path / "read.db"
    watcher = FakeWatcher()
    async with (
        await Projector.open(store, [Recorder()], read_db) as projector,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(lambda: projector.follow(poll_interval=POLL, awatch=watcher))
        await await_until("the projector to watch", lambda: watcher.running)
        await alet_time_pass(SETTLED, "the settle looks after start-up are over: only a wake-up can help now")
        watcher.touch(_log_file(store))  # the wake-up arrives first ...
        await alet_time_pass(0.002, "the projector takes its first look before the event is there")
        await store.append("s", [NewEvent(type="test.late")])  # ... the event becomes readable just after
        await await_until(
            "a second look to find the event", lambda: checkpoints(read_db)["recorder"] == 1, within=POLL / 6
        )
        tg.cancel_scope.cancel()


async def test_the_slow_poll_covers_a_failed_watcher(
    store: LogStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    read_db = tmp_path / "read.db"
    async with (
        await Projector.open(store, [Recorder()], read_db) as projector,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(lambda: projector.follow(poll_interval=0.05, awatch=FakeWatcher(fail=True)))
        await await_until("the fallback to polling", lambda: "falling back to polling" in caplog.text)
        await store.append("s", [NewEvent(type="test.polled")])
        await await_until("the poll to project the event", lambda: checkpoints(read_db)["recorder"] == 1)
        tg.cancel_scope.cancel()
    assert "falling back to polling" in caplog.text


async def test_cancelling_stops_follow_promptly_between_transactions(store: LogStore, tmp_path: Path) -> None:
    await fill(store, 5_000)
    read_db = tmp_path / "read.db"
    watcher = FakeWatcher()
    async with await Projector.open(store, [Recorder()], read_db) as projector:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: projector.follow(poll_interval=POLL, awatch=watcher))
            await await_until(
                "the catch-up to be under way", lambda: checkpoints(read_db).get("recorder", 0) > 0
            )
            cancelled_at = time.monotonic()
            tg.cancel_scope.cancel()
        stopped_in = time.monotonic() - cancelled_at
    assert not watcher.running
    assert stopped_in < POLL / 6, stopped_in  # it stopped between transactions, not at its next poll
    projected = checkpoints(read_db)["recorder"]  # whole transactions only: the rows match the checkpoint
    assert [row[0] for row in dump(read_db)["recorder"]] == list(range(1, projected + 1))


async def test_a_log_out_of_reach_for_a_while_is_waited_out(
    store: LogStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A PostgreSQL server gone for a moment made ``project --follow`` (and the dashboard's projector) stop with
    an internal error (exit 1); it now says so once, and catches up when the log is back."""
    from loopd_es.errors import StoreUnavailableError

    await fill(store, 5)
    read_db = tmp_path / "read.db"
    watcher = FakeWatcher()
    async with await Projector.open(store, [Recorder()], read_db) as projector:
        real = projector.run_once
        outage = [True, True]  # two looks while the server is away

        async def run_once(progress: Any = None) -> Any:
            if checkpoints(read_db).get("recorder") == 5 and outage:
                outage.pop()
                raise StoreUnavailableError("cannot reach postgresql://h/db: server closed the connection")
            return await real(progress)

        monkeypatch.setattr(projector, "run_once", run_once)
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: projector.follow(poll_interval=0.05, awatch=watcher))
            await await_until("the history to be projected", lambda: checkpoints(read_db)["recorder"] == 5)
            await store.append("s-new", [NewEvent(type="test.live")])
            watcher.touch(_log_file(store))
            await await_until("the catch-up after the outage", lambda: checkpoints(read_db)["recorder"] == 6)
            tg.cancel_scope.cancel()
    said = [r.getMessage() for r in caplog.records if r.name == "loopd_es.projector"]
    assert said.count("cannot reach postgresql://h/db: server closed the connection; the read models catch up "
                      "once the log is back") == 1  # fmt: skip
    assert "the log is back: the read models caught up" in said


async def test_a_read_db_deleted_under_the_follower_is_followed_afresh(
    store: LogStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The follower went on writing to the unlinked file, and the read database at its path (made by the next
    query) was never kept up to date; it now opens the one at the path and catches it up."""
    await fill(store, 5)
    read_db = tmp_path / "read.db"
    watcher = FakeWatcher()
    async with (
        await Projector.open(store, [Recorder()], read_db) as projector,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(lambda: projector.follow(poll_interval=0.05, awatch=watcher))
        await await_until("the history to be projected", lambda: checkpoints(read_db)["recorder"] == 5)
        for suffix in ("", "-wal", "-shm"):
            await anyio.Path(f"{read_db}{suffix}").unlink(missing_ok=True)
        await store.append("s-new", [NewEvent(type="test.live")])
        watcher.touch(_log_file(store))
        await await_until(
            "the new read db to be caught up",
            lambda: read_db.exists() and checkpoints(read_db).get("recorder") == 6,
            ignoring=(sqlite3.OperationalError,),  # the file is there a moment before its tables are
        )
        tg.cancel_scope.cancel()
    assert any("was removed or replaced" in r.getMessage() for r in caplog.records)
