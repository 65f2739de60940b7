"""Projector building blocks, and the test projections and helpers the other projector tests share.

``Recorder`` keeps one row per event with the position as primary key, so applying an event twice fails
loudly (and parks); ``Picky`` refuses events whose payload says ``"bad": true`` unless ``Picky.allow`` is set.
``ALL`` makes this module a registry for CLI tests (``--registry tests.unit.test_projector_base``).
"""

from __future__ import annotations

import io
import sqlite3
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from loopd_es.errors import UsageError
from loopd_es.events.envelope import Envelope, NewEvent
from loopd_es.log import LogStore, open_store
from loopd_es.projector import Projection, default_read_db, load_registry
from loopd_es.projector.base import check_registry
from loopd_es.projector.progress import MIN_EVENTS, ProgressBar, render
from loopd_es.projector.watch import log_files
from projections import StreamStats

BACKENDS = ["ndjson", "sqlite"]


class Recorder:
    """One row per event; a second apply of the same position raises IntegrityError (and so parks)."""

    name = "recorder"
    version = 1

    def schema(self, conn: sqlite3.Connection) -> None:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS recorder (position INTEGER PRIMARY KEY, stream TEXT, type TEXT, data TEXT)"
        )

    def apply(self, conn: sqlite3.Connection, envelope: Envelope) -> None:
        conn.execute(
            "INSERT INTO recorder VALUES (?, ?, ?, ?)",
            (envelope.position, envelope.stream, envelope.type, bytes(envelope.data).decode()),
        )

    def reset(self, conn: sqlite3.Connection) -> None:
        conn.execute("DROP TABLE IF EXISTS recorder")


class Picky:
    """Counts events per stream, but refuses (raises on) events whose payload has ``"bad": true``."""

    name = "picky"
    version = 1
    allow = False

    def schema(self, conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE IF NOT EXISTS picky (stream TEXT PRIMARY KEY, events INTEGER NOT NULL)")

    def apply(self, conn: sqlite3.Connection, envelope: Envelope) -> None:
        conn.execute(
            "INSERT INTO picky VALUES (?, 1) ON CONFLICT (stream) DO UPDATE SET events = events + 1",
            (envelope.stream,),
        )
        if envelope.data_dict().get("bad") and not type(self).allow:
            raise ValueError(f"refusing bad event at {envelope.position}")

    def apply_batch(self, conn: sqlite3.Connection, envelopes: Sequence[Envelope]) -> None:
        for envelope in envelopes:
            self.apply(conn, envelope)

    def reset(self, conn: sqlite3.Connection) -> None:
        conn.execute("DROP TABLE IF EXISTS picky")


ALL: list[Projection] = [StreamStats(), Recorder(), Picky()]


def url_for(backend: str, tmp_path: Path) -> str:
    return f"ndjson:{tmp_path / 'log.ndjson'}" if backend == "ndjson" else f"sqlite:{tmp_path / 'log.db'}"


@pytest.fixture(params=BACKENDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[LogStore]:
    async with await open_store(url_for(request.param, tmp_path)) as s:
        yield s


async def fill(
    store: LogStore, count: int, *, streams: int = 7, bad_every: int = 0, chunk: int = 500
) -> None:
    """Append ``count`` events over a few streams and types, in batches; every ``bad_every``-th is bad."""
    done = 0
    while done < count:
        stream = f"s-{done // chunk % streams}"
        events = []
        for i in range(done, min(done + chunk, count)):
            data: dict[str, Any] = {"i": i}
            if bad_every and i % bad_every == bad_every - 1:
                data["bad"] = True
            events.append(NewEvent(type=f"test.kind{i % 3}", data=data))
        await store.append(stream, events)
        done += len(events)


def dump(path: Path, tables: Sequence[str] = ("stream_stats", "recorder", "picky")) -> dict[str, list[Any]]:
    """Every row of the projections' tables, plus parked events without their timestamps, sorted."""
    conn = sqlite3.connect(path)
    try:
        result: dict[str, list[Any]] = {}
        for table in tables:
            if conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (table,)).fetchone():
                result[table] = sorted(conn.execute(f"SELECT * FROM {table}").fetchall())
        result["parked"] = sorted(
            conn.execute(
                "SELECT name, position, stream, type, event_id, error FROM projector_parked"
            ).fetchall()
        )
        return result
    finally:
        conn.close()


def checkpoints(path: Path) -> dict[str, int]:
    conn = sqlite3.connect(path)
    try:
        return dict(conn.execute("SELECT name, position FROM projector_checkpoints").fetchall())
    finally:
        conn.close()


# -- the building blocks themselves ------------------------------------------------------------------


def test_default_read_db_sits_beside_the_log() -> None:
    assert default_read_db("sqlite:.loopd/events.db") == Path(".loopd/read.db")
    assert default_read_db("ndjson:/var/x/events.ndjson?durability=batch") == Path("/var/x/read.db")
    assert default_read_db("ndjson:/var/x/log.ndjson?durability=batch") == Path("/var/x/log.ndjson.read.db")
    assert default_read_db("log.jsonl") == Path("log.jsonl.read.db")


def test_log_files_are_what_writers_touch() -> None:
    ndjson = [p.name for p in log_files("ndjson:/d/log.ndjson")]
    assert ndjson == ["log.ndjson", "log.ndjson.lock", "log.ndjson.idx"]
    assert [p.name for p in log_files("sqlite:/d/events.db")] == ["events.db", "events.db-wal"]


@pytest.mark.parametrize(
    ("registry", "message"),
    [
        ([Recorder(), Recorder()], "two projections are named 'recorder'"),
        ([type("Nameless", (Recorder,), {"name": "has space"})()], "needs a name"),
        ([type("Zero", (Recorder,), {"version": 0})()], "needs an integer version >= 1"),
    ],
)
def test_bad_registries_are_refused(registry: list[Projection], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        check_registry(registry)


def test_load_registry_finds_all_and_refuses_what_is_not_a_registry() -> None:
    assert [p.name for p in load_registry("tests.unit.test_projector_base")] == [
        "stream_stats",
        "recorder",
        "picky",
    ]
    import projections

    assert [p.name for p in load_registry()] == [p.name for p in projections.ALL]
    assert "stream_stats" in [p.name for p in load_registry()]
    with pytest.raises(UsageError, match="cannot import"):
        load_registry("no_such_registry_module")
    with pytest.raises(UsageError, match="must be a list of projections"):
        load_registry("loopd_es.errors")


def test_progress_bar_draws_only_for_large_catch_ups(monkeypatch: pytest.MonkeyPatch) -> None:
    assert render(500, 1000, 1, 2.0).startswith("[" + "#" * 15 + "." * 15 + "]  50%")
    out = io.StringIO()
    bar = ProgressBar(out)
    bar.started -= 10
    bar(10, MIN_EVENTS // 2)  # small catch-up: nothing
    assert out.getvalue() == ""
    bar = ProgressBar(out)
    bar.started -= 10
    bar(1, MIN_EVENTS * 3)
    bar.close()
    assert out.getvalue().startswith("\r[") and out.getvalue().endswith("events  0/s\n")
