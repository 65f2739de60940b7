"""Catch-up: every event applied once, in batches, checkpointed; version changes rebuild; logs never mix."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import anyio
import pytest

from loopd_es.events.envelope import NewEvent
from loopd_es.log import LogStore, open_store
from loopd_es.projector import BatchResult, ProjectionError, Projector
from projections import StreamStats

from .test_projector_base import Recorder, checkpoints, dump, fill, store

pytestmark = pytest.mark.anyio
__all__ = ("store",)  # the parametrised (ndjson, sqlite) fixture


async def test_catch_up_applies_every_event_once_in_batches(store: LogStore, tmp_path: Path) -> None:
    await fill(store, 9_000)
    commits: list[BatchResult] = []
    read_db = tmp_path / "read.db"
    async with await Projector.open(store, [StreamStats(), Recorder()], read_db) as projector:
        projector.on_commit = lambda result, _t: commits.append(result)
        assert await projector.run_once() == 2 * 9_000
        assert (
            2 <= len(commits) <= 3
        )  # one transaction (one thread hop) per read batch of 4096, not per event
        assert await projector.run_once() == 0  # nothing new: nothing applied twice
        await fill(store, 10)
        assert await projector.run_once() == 2 * 10
        head, rows = await projector.status()
    assert head == 9_010 and [(r.name, r.position, r.parked) for r in rows] == [
        ("stream_stats", 9_010, 0),
        ("recorder", 9_010, 0),
    ]
    rows_ = dump(read_db)
    assert [r[0] for r in rows_["recorder"]] == list(range(1, 9_011))
    assert sum(r[2] for r in rows_["stream_stats"]) == 9_010
    assert rows_["parked"] == []


async def test_stream_stats_batch_path_equals_event_by_event(store: LogStore, tmp_path: Path) -> None:
    await fill(store, 2_000, streams=5, chunk=37)
    events = [e async for e in store.read_all()]
    by_batch, by_event = sqlite3.connect(":memory:"), sqlite3.connect(":memory:")
    stats = StreamStats()
    for conn in (by_batch, by_event):
        stats.schema(conn)
    for start in range(0, len(events), 300):
        stats.apply_batch(by_batch, events[start : start + 300])
    for envelope in events:
        stats.apply(by_event, envelope)
    query = "SELECT * FROM stream_stats ORDER BY stream, type"
    assert by_batch.execute(query).fetchall() == by_event.execute(query).fetchall()
    assert len(by_event.execute(query).fetchall()) == 15


async def test_a_new_projection_catches_up_without_reapplying_to_the_others(
    store: LogStore, tmp_path: Path
) -> None:
    await fill(store, 100)
    read_db = tmp_path / "read.db"
    async with await Projector.open(store, [Recorder()], read_db) as projector:
        await projector.run_once()
    async with await Projector.open(store, [Recorder(), StreamStats()], read_db) as projector:
        assert await projector.run_once() == 100  # only stream_stats applied anything
    assert checkpoints(read_db) == {"recorder": 100, "stream_stats": 100}
    assert dump(read_db)["parked"] == []


async def test_a_changed_version_rebuilds_the_projection(store: LogStore, tmp_path: Path) -> None:
    await fill(store, 50)
    read_db = tmp_path / "read.db"
    async with await Projector.open(store, [StreamStats()], read_db) as projector:
        await projector.run_once()
    before = dump(read_db)
    conn = sqlite3.connect(read_db)
    conn.execute("INSERT INTO stream_stats VALUES ('stale', 'x', 1, 1, 1, 'then')")
    conn.commit()
    conn.close()

    class StreamStatsV2(StreamStats):
        version = 2

    async with await Projector.open(store, [StreamStatsV2()], read_db) as projector:
        assert checkpoints(read_db)["stream_stats"] == 0  # reset on open ...
        assert await projector.run_once() == 50  # ... and rebuilt by the next catch-up
    assert dump(read_db) == before


async def test_two_projectors_on_one_read_db_never_apply_an_event_twice(
    store: LogStore, tmp_path: Path
) -> None:
    await fill(store, 10_000)
    read_db = tmp_path / "read.db"
    async with (
        await Projector.open(store, [Recorder()], read_db) as one,
        await Projector.open(store, [Recorder()], read_db) as two,
    ):
        async with anyio.create_task_group() as tg:
            tg.start_soon(one.run_once)
            tg.start_soon(two.run_once)
    rows = dump(read_db)
    assert rows["parked"] == []  # a double apply would have hit the primary key and parked
    assert len(rows["recorder"]) == 10_000


async def test_a_read_db_built_from_another_log_is_refused(tmp_path: Path) -> None:
    read_db = tmp_path / "read.db"
    async with await open_store(f"sqlite:{tmp_path / 'a.db'}") as a:
        await a.append("s", [NewEvent(type="test.a")])
        async with await Projector.open(a, [Recorder()], read_db) as projector:
            await projector.run_once()
    async with await open_store(f"sqlite:{tmp_path / 'b.db'}") as b:
        await b.append("s", [NewEvent(type="test.b")])
        async with await Projector.open(b, [Recorder()], read_db) as projector:
            with pytest.raises(ProjectionError, match="built from another log"):
                await projector.run_once()
            assert await projector.rebuild() == 1  # a full rebuild adopts the new log
        assert [r[2] for r in dump(read_db)["recorder"]] == ["test.b"]


async def test_a_read_db_ahead_of_its_log_is_refused(tmp_path: Path) -> None:
    read_db = tmp_path / "read.db"
    async with await open_store(f"sqlite:{tmp_path / 'a.db'}") as log:
        await fill(log, 20)
        async with await Projector.open(log, [Recorder()], read_db) as projector:
            await projector.run_once()
    async with await open_store(f"sqlite:{tmp_path / 'b.db'}") as older:
        async with await open_store(f"sqlite:{tmp_path / 'a.db'}") as log:
            await older.import_envelopes(log.read_batches(limit=10))  # an older copy: same first event
        async with await Projector.open(older, [Recorder()], read_db) as projector:
            with pytest.raises(ProjectionError, match="is at position 20 but .* ends at 10"):
                await projector.run_once()


async def test_progress_reports_each_batch_against_the_head(store: LogStore, tmp_path: Path) -> None:
    await fill(store, 5_000)
    seen: list[tuple[int, int]] = []
    async with await Projector.open(store, [StreamStats()], tmp_path / "read.db") as projector:
        await projector.run_once(progress=lambda position, head: seen.append((position, head)))
    positions = [position for position, _ in seen]
    assert len(seen) >= 2 and positions == sorted(positions) and positions[-1] == 5_000
    assert {head for _, head in seen} == {5_000}


async def test_an_unusable_read_db_is_a_projection_error(store: LogStore, tmp_path: Path) -> None:
    bad = tmp_path / "read.db"
    bad.write_bytes(b"this is not a database" * 100)
    with pytest.raises(ProjectionError, match="read database"):
        await Projector.open(store, [StreamStats()], bad)
