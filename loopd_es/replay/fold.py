"""Fold one stream, a goal with everything linked to it, or the whole log, up to a position or a time.

Reads go through the :class:`~loopd_es.log.base.LogStore` protocol a batch at a time and are fed to the pure
folds of :mod:`loopd_es.domain.reducers`. Snapshots (:mod:`.snapshots`) shortcut the fold of one stream;
snapshot + tail is by construction the same fold as a full replay, and a test checks it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import msgspec

from ..domain.reducers import Cut, Folded, LogFold, StreamFold, reducer_for, start
from ..domain.streams import GOAL_PREFIX, goal_stream
from ..errors import CorruptLogError, StreamNotFoundError
from ..events.envelope import Foldable, LogRows, StreamRows

B = TypeVar("B", bound=Sequence[Foldable] | StreamRows | LogRows)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable
    from datetime import datetime

    from ..log.base import LogStore
    from .snapshots import SnapshotStore


async def replay_stream(
    store: LogStore,
    stream: str,
    *,
    until: int | None = None,
    at: datetime | None = None,
    snapshots: SnapshotStore | None = None,
) -> Folded:
    """Fold ``stream`` (from its snapshot when one fits the cut), saving a new snapshot when due.

    :raises StreamNotFoundError: when the stream has no events.
    """
    cut = Cut(until, at)
    folded = start(stream)
    snap = snapshots.load(stream) if snapshots is not None else None
    if snap is not None and not cut.passed(snap.position, snap.recorded_at):
        folded.state = msgspec.msgpack.decode(snap.state, type=reducer_for(stream)[0].state_type)
        folded.version, folded.position, folded.recorded_at = snap.version, snap.position, snap.recorded_at
        folded.snapshot_version = snap.version
    folding = StreamFold(folded)
    if cut.at is None and folding.takes_rows:  # a goal, cut (if at all) at a position: the store cuts it
        read = await feed_ahead(
            store.read_stream_rows(stream, from_version=folded.version + 1, until_position=cut.until),
            _feeding_rows(folding),
        )
    else:

        def feed(batch: Sequence[Foldable]) -> bool:
            keep = cut.keep(batch)
            folding.feed(batch if keep == len(batch) else batch[:keep])
            return keep == len(batch)

        read = await feed_ahead(store.read_recorded(stream=stream, from_version=folded.version + 1), feed)
    if not read and await store.stream_version(stream) == 0:  # asked only when the read says nothing
        raise StreamNotFoundError(stream)
    folded = folding.result()
    since = snap.version if snap else 0
    if snapshots is not None and folded.version - since >= snapshots.every:
        snapshots.save(stream, folded.version, folded.position, folded.recorded_at, folded.state)
    return folded


def _feeding_rows(folding: StreamFold) -> Callable[[StreamRows], bool]:
    def feed(batch: StreamRows) -> bool:
        folding.feed_rows(batch)
        return True

    return feed


async def replay_all(
    store: LogStore, *, until: int | None = None, at: datetime | None = None
) -> dict[str, Folded]:
    """Fold every stream of the log in one pass, in global order; returns states by stream name.

    Goals are read as rows (:meth:`~loopd_es.log.base.LogStore.read_log_rows`) unless the cut is a time, which
    needs every event's time.

    :raises CorruptLogError: when a goal stream's versions have a gap.
    """
    cut = Cut(until, at)
    folding = LogFold()
    if at is not None:

        def feed(batch: Sequence[Foldable]) -> bool:
            keep = cut.keep(batch)
            folding.feed(batch if keep == len(batch) else batch[:keep])
            return keep == len(batch)

        await feed_ahead(store.read_recorded(limit=until), feed)
        return folding.result()
    places: dict[str, tuple[int, int, str]] = {}

    def feed_rows(batch: LogRows) -> bool:
        folding.feed(batch.recorded)
        folding.feed_rows(batch.rows)
        if batch.places is not None:
            places.update(batch.places)
        return True

    await feed_ahead(store.read_log_rows(rows_prefix=GOAL_PREFIX, until_position=until), feed_rows)
    wrong = folding.place(places)
    if wrong:
        raise CorruptLogError(store.url, None, f"stream {wrong[0]!r} has a gap in its versions")
    return folding.result()


async def feed_ahead(batches: AsyncIterator[B], feed: Callable[[B], bool]) -> bool:
    """Give each batch to ``feed`` (which returns False to stop) while the store reads the next one.

    Reading and folding overlap where the read waits on something else: PostgreSQL's next batch is on its way
    from the server while this one folds. SQLite reads its batches on the event-loop thread (building rows
    needs the GIL, so a worker thread bought no overlap), and there the two simply alternate. Returns
    whether any batch was read; a read that fails raises its own error, not an ``ExceptionGroup``.
    """
    send, receive = anyio.create_memory_object_stream[B](1)
    read = False
    failed: list[Exception] = []

    async def produce() -> None:
        async with send:
            try:
                async for batch in batches:
                    await send.send(batch)
            except Exception as e:  # raised below as itself (a corrupt log, say), not in an ExceptionGroup
                failed.append(e)
            finally:  # a stopped fold cancels this task: the read ends here, not when collected
                close = getattr(batches, "aclose", None)
                if close is not None:
                    with anyio.CancelScope(shield=True):
                        await close()

    async with anyio.create_task_group() as tg:
        tg.start_soon(produce)
        async with receive:
            async for batch in receive:
                read = True
                if not feed(batch):
                    tg.cancel_scope.cancel()
                    break
    if failed:
        raise failed[0]
    return read


async def replay_goal(
    store: LogStore, goal_id: str, *, until: int | None = None, at: datetime | None = None
) -> tuple[Folded, list[Folded]]:
    """A goal's stream and every other stream linked to it (a command started for it or awaited by it)."""
    states = await replay_all(store, until=until, at=at)
    stream = goal_stream(goal_id)
    goal = states.pop(stream, None) or start(stream)
    linked = [f for f in states.values() if _links_to(f.state, goal_id)]
    return goal, linked


def _links_to(state: Any, goal_id: str) -> bool:
    if getattr(state, "goal_id", None) == goal_id:
        return True
    awaits = getattr(state, "awaits", None)
    if isinstance(awaits, dict):
        return goal_id in awaits
    if isinstance(awaits, tuple | list):
        return any(getattr(a, "goal_id", None) == goal_id for a in awaits)
    return False
