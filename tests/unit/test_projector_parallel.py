"""A rebuild on two cores (half of the read models in a worker process) leaves exactly the rows of one process."""

from __future__ import annotations

import gc
import os
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from loopd_es.projector import Projection, ProjectionError, Projector
from loopd_es.projector.parallel import part_path, relaxed_gc, split
from projections import ALL, StreamStats

from .test_projections_base import TABLES, append_story, dump, story
from .test_projector_base import Picky, Recorder, checkpoints, fill
from .test_projector_base import dump as dump_test_models
from .test_projector_base import store as store

if TYPE_CHECKING:
    from loopd_es.events.envelope import Envelope
    from loopd_es.log import LogStore

pytestmark = pytest.mark.anyio


async def test_parallel_rebuild_equals_one_process_and_incremental(store: LogStore, tmp_path: Path) -> None:
    steps = story()
    read_db = tmp_path / "read.db"
    async with await Projector.open(store, ALL, read_db) as projector:
        for k in range(0, len(steps), 5):
            await append_story(store, steps[k : k + 5])
            await projector.run_once()
        built = dump(read_db)
        assert all(built[t] for t in TABLES)
        head = await store.head()
        assert await projector.rebuild(parallel=True) == head * len(ALL)
        assert dump(read_db) == built
        assert set(checkpoints(read_db).values()) == {head}
        assert not part_path(read_db).exists()  # the worker's read db is gone
        await projector.rebuild(parallel=False)
        assert dump(read_db) == built


async def test_parked_events_and_checkpoints_come_over_from_the_worker(
    store: LogStore, tmp_path: Path
) -> None:
    await fill(store, 300, bad_every=37)
    read_db = tmp_path / "read.db"
    registry: list[Projection] = [StreamStats(), Recorder(), Picky()]
    async with await Projector.open(store, registry, read_db) as projector:
        await projector.run_once()
        built = dump_test_models(read_db)
        assert built["parked"]
        await projector.rebuild(parallel=True)
        assert dump_test_models(read_db) == built
        assert set(checkpoints(read_db).values()) == {300}
        await fill(store, 10)  # and it goes on incrementally from there
        assert await projector.run_once() == 30


class _Named:
    def __init__(self, name: str, cost: float, affinity: str | None = None) -> None:
        self.name, self.version, self.rebuild_cost, self.rebuild_affinity = name, 1, cost, affinity

    def schema(self, conn: sqlite3.Connection) -> None: ...
    def apply(self, conn: sqlite3.Connection, envelope: Envelope) -> None: ...
    def reset(self, conn: sqlite3.Connection) -> None: ...


def test_split_balances_cost_and_keeps_affine_models_together() -> None:
    models = [_Named("a", 1.6), _Named("g", 1.6, "fold"), _Named("r", 3.8, "fold"), _Named("i", 2.1),
              _Named("p", 0.4), _Named("l", 1.0), _Named("c", 0.2)]  # fmt: skip
    shares = split(models)
    assert shares is not None
    here, there = ([p.name for p in share] for share in shares)
    assert there == ["g", "r"] and here == [
        "a",
        "i",
        "p",
        "l",
        "c",
    ]  # 5.3 here against 5.4 there (the worker takes the heavier), registry order kept
    assert split([_Named("g", 1, "fold"), _Named("r", 1, "fold")]) is None  # one group: nothing to split


class FailsElsewhere:
    """A read model whose schema fails in any process but the one that made it."""

    name = "fails_elsewhere"
    version = 1

    def __init__(self) -> None:
        self.home = os.getpid()

    def schema(self, conn: sqlite3.Connection) -> None:
        if os.getpid() != self.home:
            raise RuntimeError("no schema in this process")
        conn.execute("CREATE TABLE IF NOT EXISTS fails_elsewhere (x INTEGER)")

    def apply(self, conn: sqlite3.Connection, envelope: Envelope) -> None: ...

    def reset(self, conn: sqlite3.Connection) -> None:
        conn.execute("DROP TABLE IF EXISTS fails_elsewhere")


async def test_a_failing_worker_fails_the_rebuild_and_says_why(store: LogStore, tmp_path: Path) -> None:
    await fill(store, 20)
    registry: list[Projection] = [Recorder(), FailsElsewhere()]
    async with await Projector.open(store, registry, tmp_path / "read.db") as projector:
        with pytest.raises(
            ProjectionError, match="parallel rebuild worker failed .*no schema in this process"
        ):
            await projector.rebuild(parallel=True)
        assert not part_path(tmp_path / "read.db").exists()


def test_the_collector_runs_less_often_during_a_rebuild_and_as_before_after() -> None:
    before = gc.get_threshold()
    with relaxed_gc(threshold=before[0] + 1000):
        assert gc.get_threshold() == (before[0] + 1000, *before[1:])
    assert gc.get_threshold() == before


async def test_projections_that_cannot_travel_are_rebuilt_here(store: LogStore, tmp_path: Path) -> None:
    class Local(Recorder):  # defined in a function: pickle cannot send it to a worker
        name = "local"

    await fill(store, 50)
    registry: list[Projection] = [StreamStats(), Local()]
    async with await Projector.open(store, registry, tmp_path / "read.db") as projector:
        assert await projector.rebuild(parallel=True) == 100
        assert set(checkpoints(tmp_path / "read.db").values()) == {50}
