"""Events a projection cannot apply are parked with their error; the projector goes on; retry re-applies."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from loopd_es.projector import Projector, UnknownProjectionError
from projections import StreamStats

from .test_projector_base import Picky, checkpoints, dump, fill, store

if TYPE_CHECKING:
    from loopd_es.log import LogStore

pytestmark = pytest.mark.anyio
__all__ = ("store",)


@pytest.fixture(autouse=True)
def strict_picky() -> Iterator[None]:
    Picky.allow = False
    yield
    Picky.allow = False


async def test_a_failing_event_is_parked_and_the_others_applied(store: LogStore, tmp_path: Path) -> None:
    await fill(store, 1_000, bad_every=100)  # positions 100, 200, ... 1000 are bad
    read_db = tmp_path / "read.db"
    async with await Projector.open(store, [Picky(), StreamStats()], read_db) as projector:
        assert await projector.run_once() == 990 + 1_000
        head, rows = await projector.status()
    assert [(r.name, r.position, r.parked) for r in rows] == [
        ("picky", 1_000, 10),
        ("stream_stats", 1_000, 0),
    ]
    assert rows[0].last_error == "ValueError: refusing bad event at 1000"
    parked = dump(read_db)["parked"]
    assert [p[1] for p in parked] == list(range(100, 1_001, 100))
    assert all(p[0] == "picky" and p[5].startswith("ValueError: refusing bad event") for p in parked)
    # the failed applies were rolled back: picky counted only the 990 good events
    assert sum(r[1] for r in dump(read_db)["picky"]) == 990


async def test_retry_reapplies_parked_events_once_the_cause_is_gone(store: LogStore, tmp_path: Path) -> None:
    await fill(store, 300, bad_every=100)
    read_db = tmp_path / "read.db"
    async with await Projector.open(store, [Picky(), StreamStats()], read_db) as projector:
        await projector.run_once()
        assert await projector.retry() == (0, 3)  # still failing: stays parked, attempts counted
        assert [p[1] for p in dump(read_db)["parked"]] == [100, 200, 300]
        Picky.allow = True
        assert await projector.retry("picky") == (3, 0)
        assert await projector.retry() == (0, 0)
        with pytest.raises(UnknownProjectionError, match="unknown projection 'nope'"):
            await projector.retry("nope")
    assert dump(read_db)["parked"] == []
    assert sum(r[1] for r in dump(read_db)["picky"]) == 300
    assert checkpoints(read_db) == {"picky": 300, "stream_stats": 300}
