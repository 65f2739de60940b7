"""Follow mode against a scripted watcher: file events drive it, the poll backs it up, cancelling stops it."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from loopd_es.events.envelope import NewEvent
from loopd_es.projector import Projector

from .test_projector_base import Recorder, checkpoints, fill, store

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


async def until(predicate: Callable[[], bool], seconds: float) -> float:
    """Wait until ``predicate()``; returns how long that took. Fails the test after ``seconds``."""
    start = time.monotonic()
    with anyio.fail_after(seconds):
        while not predicate():  # noqa: ASYNC110 - another thread or process changes the read db
            await anyio.sleep(0.002)
    return time.monotonic() - start


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
        tg.start_soon(lambda: projector.follow(poll_interval=60, awatch=watcher))
        await until(lambda: checkpoints(read_db)["recorder"] == 20, 5)  # history first
        assert watcher.kwargs["debounce"] == 0 and watcher.kwargs["step"] == 1
        assert watcher.kwargs["recursive"] is False and watcher.paths == (
            str(tmp_path),
        )  # tmp_path is absolute
        await anyio.sleep(0.1)  # the settle looks after start-up are over: only a wake-up can help now

        await store.append("s-new", [NewEvent(type="test.live")])
        watcher.touch(str(read_db))  # the read db sits in the same directory: not a reason to look
        await anyio.sleep(0.2)
        assert checkpoints(read_db)["recorder"] == 20
        watcher.touch(_log_file(store))
        await until(lambda: checkpoints(read_db)["recorder"] == 21, 1)
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
        tg.start_soon(lambda: projector.follow(poll_interval=60, awatch=watcher))
        await anyio.sleep(0.1)
        watcher.touch(_log_file(store))  # the wake-up arrives first ...
        await anyio.sleep(0.002)
        await store.append("s", [NewEvent(type="test.late")])  # ... the event becomes readable just after
        await until(lambda: checkpoints(read_db)["recorder"] == 1, 0.5)
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
        await anyio.sleep(0.1)
        await store.append("s", [NewEvent(type="test.polled")])
        await until(lambda: checkpoints(read_db)["recorder"] == 1, 1)
        tg.cancel_scope.cancel()
    assert "falling back to polling" in caplog.text


async def test_cancelling_stops_follow_promptly_between_transactions(store: LogStore, tmp_path: Path) -> None:
    await fill(store, 5_000)
    read_db = tmp_path / "read.db"
    watcher = FakeWatcher()
    async with await Projector.open(store, [Recorder()], read_db) as projector:
        deadline = time.monotonic() + 0.5
        with anyio.move_on_after(0.5):
            await projector.follow(poll_interval=60, awatch=watcher)
        assert time.monotonic() - deadline < 0.1
    assert not watcher.running
    assert checkpoints(read_db)["recorder"] == 5_000
