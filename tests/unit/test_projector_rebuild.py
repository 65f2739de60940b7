"""A rebuild from the log is identical, row by row, to the read model built incrementally."""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from loopd_es.projector import Projection, Projector, UnknownProjectionError
from projections import StreamStats

from .test_projector_base import Picky, Recorder, checkpoints, dump, fill, store

if TYPE_CHECKING:
    from loopd_es.log import LogStore

pytestmark = pytest.mark.anyio
__all__ = ("store",)


@pytest.mark.parametrize("seed", [1, 2])
async def test_rebuild_equals_incremental_row_by_row(store: LogStore, tmp_path: Path, seed: int) -> None:
    rand = random.Random(seed)
    incremental, fresh = tmp_path / "incremental.db", tmp_path / "fresh.db"
    registry: list[Projection] = [StreamStats(), Recorder(), Picky()]
    async with await Projector.open(store, registry, incremental) as projector:
        total = 0
        for _ in range(25):  # many small appends, each followed by a catch-up: many batch boundaries
            count = rand.randint(1, 400)
            await fill(
                store,
                count,
                streams=rand.randint(1, 9),
                bad_every=rand.choice([0, 37]),
                chunk=rand.randint(1, 50),
            )
            total += count
            await projector.run_once()
        built = dump(incremental)
        assert len(built["recorder"]) == total and built["parked"]  # some events were parked along the way

        assert await projector.rebuild() > 0
        assert dump(incremental) == built
        assert set(checkpoints(incremental).values()) == {total}

        await projector.rebuild("stream_stats")
        assert dump(incremental) == built
    async with await Projector.open(store, registry, fresh) as projector:
        await projector.run_once()
    assert dump(fresh) == built


async def test_rebuild_of_one_projection_leaves_the_others_alone(store: LogStore, tmp_path: Path) -> None:
    await fill(store, 200)
    read_db = tmp_path / "read.db"
    async with await Projector.open(store, [StreamStats(), Recorder()], read_db) as projector:
        await projector.run_once()
        before = dump(read_db)
        assert await projector.rebuild("stream_stats") == 200  # only stream_stats applied again
        assert dump(read_db) == before  # recorder would have parked 200 duplicates if re-applied
        with pytest.raises(UnknownProjectionError, match="registered projections: stream_stats, recorder"):
            await projector.rebuild("nope")
