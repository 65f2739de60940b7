"""Why the SQLite store drives stdlib ``sqlite3`` itself and not ``aiosqlite``: the same statements both ways.

    pip install aiosqlite        # benchmark-only, like the eventsourcing peer; not a loopd-es dependency
    python tools/bench_sqlite_driver.py [--single 500] [--batches 100] [--stream 10000] [--lookups 2000] [--rounds 8]

Each round runs every way of driving the database, in rotating order, so that a neighbour's load hits them
alike (``--rounds`` a multiple of the four ways lets each lead equally often). The writes go to fresh files
(the log's own schema and rows, WAL, ``synchronous=FULL``); the reads and look-ups share one filled file.
Prints one JSON document: per work and per way the median rate, the per-round rates, and the median of the
per-round ratios against ``aiosqlite``.

The ways:

- ``aiosqlite``: its public API at its cheapest: ``execute_fetchall``, one hop to its thread and back per
  statement (``execute`` then ``fetchall`` on a cursor would be three). It has no public way to run several
  statements in one hop, so a transaction of four statements is four hops.
- ``sqlite3_worker``: stdlib ``sqlite3`` on one worker thread (``anyio.to_thread.run_sync`` with a capacity
  limiter of 1), one hop per unit of work: a whole transaction per hand-off.
- ``sqlite3_inline``: stdlib ``sqlite3`` on the event-loop thread (what the store does for an uncontended commit
  and for short reads on its query-only connection).
- ``store``: the loopd-es SQLite store itself, for scale (envelopes, checks, checksums and all), on the works
  whose statements it runs: for a lone append it runs one INSERT, never the checked transaction (``null``).

The works: durable single appends (one autocommit INSERT each, the store's fast path); durable single appends
checked in a transaction (BEGIN IMMEDIATE, a version SELECT, INSERT, COMMIT: the store's general path, taken for
a group of appenders or a conflict); 100-event batches (one multi-row INSERT each); reading a ``--stream``-event
stream in pages of 4096; short look-ups (a stream's version, one statement each).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import anyio
import anyio.to_thread
import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loopd_es.events.envelope import NewEvent, new_event_id
from loopd_es.log import open_store
from loopd_es.log.sqlite_fast import _insert_many
from loopd_es.log.sqlite_ops import _SCHEMA, INSERT, row_crc

PAYLOAD = {"goal_id": "g-000123", "summary": "s" * 120, "turn": 7}
TYPE = "goal.progress"
STREAM = "goal-1"
PAGE = 4096
READ = "SELECT position, version, type, schema_version, recorded_at, data FROM events WHERE stream = ? AND version > ? ORDER BY version LIMIT ?"
LOOKUP = "SELECT coalesce(max(version), 0) FROM events WHERE stream = ?"
WAYS = ("aiosqlite", "sqlite3_worker", "sqlite3_inline", "store")

Rows = list[tuple[Any, ...]]


def rows(first: int, n: int) -> Rows:
    """``n`` rows of the log's own table, positions and versions from ``first`` (checksums included)."""
    data = msgspec.json.encode(PAYLOAD)
    out: Rows = []
    for i in range(first, first + n):
        fields = (i, STREAM, i, new_event_id(), TYPE, 1, "2026-12-07T09:00:00.123456Z", None, None, data)
        out.append((*fields, row_crc(*fields)))
    return out


def new_db(path: Path) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(_SCHEMA)
    conn.close()


def plain(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA synchronous = FULL")
    return conn


# -- writes: units of statements, run the same way by each ----------------------------------------------

Unit = list[tuple[str, tuple[Any, ...]]]
"""One unit of work: statements and their parameters, run in order (one commit)."""


def single_units(batch: Rows) -> list[Unit]:
    """The store's fast path for a lone event: one INSERT in autocommit (aiosqlite's best case: one hop)."""
    return [[(INSERT, row)] for row in batch]


def batch_units(batch: Rows, size: int) -> list[Unit]:
    """The store's fast path for a batch: one multi-row INSERT in autocommit."""
    return [
        [(_insert_many(len(chunk)), tuple(v for row in chunk for v in row))]
        for chunk in (batch[k : k + size] for k in range(0, len(batch), size))
    ]


def checked_units(batch: Rows) -> list[Unit]:
    """The store's careful path (a group, a conflict to resolve): the version check and the insert in one
    transaction, ``BEGIN IMMEDIATE`` to ``COMMIT`` (four statements: four hops through aiosqlite, one here)."""
    return [[("BEGIN IMMEDIATE", ()), (LOOKUP, (STREAM,)), (INSERT, row), ("COMMIT", ())] for row in batch]


def _run_unit(conn: sqlite3.Connection, unit: Unit) -> None:
    for statement, params in unit:
        conn.execute(statement, params).fetchall()


async def units_aiosqlite(path: Path, units: list[Unit], events: int) -> float:
    import aiosqlite

    async with aiosqlite.connect(path, isolation_level=None) as db:
        await db.execute_fetchall("PRAGMA synchronous = FULL")
        t = time.perf_counter()
        for unit in units:
            for statement, params in unit:
                await db.execute_fetchall(statement, params)  # one hop: execute and fetch on its thread
        return events / (time.perf_counter() - t)


async def units_worker(path: Path, units: list[Unit], events: int) -> float:
    conn, limiter = plain(path), anyio.CapacityLimiter(1)
    t = time.perf_counter()
    for unit in units:
        await anyio.to_thread.run_sync(_run_unit, conn, unit, limiter=limiter)
    rate = events / (time.perf_counter() - t)
    conn.close()
    return rate


async def units_inline(path: Path, units: list[Unit], events: int) -> float:
    conn = plain(path)
    t = time.perf_counter()
    for unit in units:
        _run_unit(conn, unit)
        await anyio.lowlevel.checkpoint()
    rate = events / (time.perf_counter() - t)
    conn.close()
    return rate


async def store_appends(path: Path, n: int, size: int) -> float:
    """The store writing ``n`` events ``size`` at a time into a log of its own at ``path``."""
    async with await open_store(f"sqlite:{path}") as store:
        events = [[NewEvent(type=TYPE, data=PAYLOAD) for _ in range(size)] for _ in range(n // size)]
        t = time.perf_counter()
        for k, chunk in enumerate(events):
            await store.append(STREAM, chunk, k * size)
        return len(events) * size / (time.perf_counter() - t)


# -- reads ------------------------------------------------------------------------------------------------


def _page(conn: sqlite3.Connection, after: int) -> Rows:
    return conn.execute(READ, (STREAM, after, PAGE)).fetchall()


async def read_aiosqlite(path: Path, n: int) -> float:
    import aiosqlite

    async with aiosqlite.connect(path, isolation_level=None) as db:
        t = time.perf_counter()
        got, after = 0, 0
        while True:
            page = cast(Rows, await db.execute_fetchall(READ, (STREAM, after, PAGE)))  # a list, typed loosely
            got += len(page)
            if len(page) < PAGE:
                break
            after = page[-1][1]
        rate = n / (time.perf_counter() - t)
        _check_count(got, n)
        return rate


def _check_count(got: int, n: int) -> None:
    if got != n:
        raise RuntimeError(f"read {got} rows where the stream holds {n}: the measurement is void")


async def read_pages(path: Path, n: int, on_worker: bool) -> float:
    """Rows/s of reading the stream page by page with stdlib ``sqlite3``, on one worker thread or inline."""
    conn, limiter = plain(path), anyio.CapacityLimiter(1)
    t = time.perf_counter()
    got, after = 0, 0
    while True:
        if on_worker:
            page = await anyio.to_thread.run_sync(_page, conn, after, limiter=limiter)
        else:
            page = _page(conn, after)
            await anyio.lowlevel.checkpoint()
        got += len(page)
        if len(page) < PAGE:
            break
        after = page[-1][1]
    rate = n / (time.perf_counter() - t)
    conn.close()
    _check_count(got, n)
    return rate


async def read_store(path: Path, n: int) -> float:
    async with await open_store(f"sqlite:{path}", create=False) as store:
        t = time.perf_counter()
        got = 0
        async for page in store.read_recorded(stream=STREAM):
            got += len(page)
        rate = n / (time.perf_counter() - t)
        _check_count(got, n)
        return rate


async def lookups_aiosqlite(path: Path, n: int) -> float:
    import aiosqlite

    async with aiosqlite.connect(path, isolation_level=None) as db:
        t = time.perf_counter()
        for _ in range(n):
            await db.execute_fetchall(LOOKUP, (STREAM,))
        return n / (time.perf_counter() - t)


def _lookup(conn: sqlite3.Connection) -> Any:
    return conn.execute(LOOKUP, (STREAM,)).fetchone()


async def lookups_worker(path: Path, n: int) -> float:
    conn, limiter = plain(path), anyio.CapacityLimiter(1)
    t = time.perf_counter()
    for _ in range(n):
        await anyio.to_thread.run_sync(_lookup, conn, limiter=limiter)
    rate = n / (time.perf_counter() - t)
    conn.close()
    return rate


async def lookups_inline(path: Path, n: int) -> float:
    conn = plain(path)
    t = time.perf_counter()
    for _ in range(n):
        _lookup(conn)
        await anyio.lowlevel.checkpoint()
    rate = n / (time.perf_counter() - t)
    conn.close()
    return rate


async def lookups_store(path: Path, n: int) -> float:
    async with await open_store(f"sqlite:{path}", create=False) as store:
        t = time.perf_counter()
        for _ in range(n):
            await store.stream_version(STREAM)
        return n / (time.perf_counter() - t)


# -- one round ----------------------------------------------------------------------------------------------


def _ways(
    work: str, args: argparse.Namespace, directory: Path, filled: Path
) -> dict[str, Callable[[], Awaitable[float]]]:
    """Each way's measurement of ``work``, as a function to await (fresh files for the writes)."""

    def fresh(way: str) -> Path:
        path = directory / f"{work}-{way}-{os.urandom(4).hex()}.db"
        if way != "store":  # the store makes its own log
            new_db(path)
        return path

    writes = {
        "single_append": (single_units(rows(1, args.single)), args.single, 1),
        "checked_append": (checked_units(rows(1, args.single)), args.single, 1),
        "batch_100": (batch_units(rows(1, args.batches * 100), 100), args.batches * 100, 100),
    }
    if work in writes:
        units, events, size = writes[work]
        ways: dict[str, Callable[[], Awaitable[float]]] = {
            "aiosqlite": lambda: units_aiosqlite(fresh("aiosqlite"), units, events),
            "sqlite3_worker": lambda: units_worker(fresh("sqlite3_worker"), units, events),
            "sqlite3_inline": lambda: units_inline(fresh("sqlite3_inline"), units, events),
        }
        if work != "checked_append":  # a lone append never runs the checked transaction in the store
            ways["store"] = lambda: store_appends(fresh("store"), events, size)
        return ways
    if work == "read_stream":
        return {
            "aiosqlite": lambda: read_aiosqlite(filled, args.stream),
            "sqlite3_worker": lambda: read_pages(filled, args.stream, on_worker=True),
            "sqlite3_inline": lambda: read_pages(filled, args.stream, on_worker=False),
            "store": lambda: read_store(filled, args.stream),
        }
    return {
        "aiosqlite": lambda: lookups_aiosqlite(filled, args.lookups),
        "sqlite3_worker": lambda: lookups_worker(filled, args.lookups),
        "sqlite3_inline": lambda: lookups_inline(filled, args.lookups),
        "store": lambda: lookups_store(filled, args.lookups),
    }


WORKS = {
    "single_append": "durable single appends (one autocommit INSERT each), events/s",
    "checked_append": "durable single appends checked in a transaction (BEGIN IMMEDIATE, SELECT, INSERT, COMMIT), events/s",
    "batch_100": "100-event batches (one multi-row INSERT each), events/s",
    "read_stream": "reading one stream page by page, rows/s",
    "lookup": "short look-ups (a stream's version), look-ups/s",
}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    rates: dict[str, dict[str, list[float]]] = {w: {way: [] for way in WAYS} for w in WORKS}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        directory = Path(tmp)
        filled = directory / "stream.db"
        async with await open_store(f"sqlite:{filled}?synchronous=OFF") as store:
            for start in range(0, args.stream, 1000):
                events = [NewEvent(type=TYPE, data=PAYLOAD) for _ in range(min(1000, args.stream - start))]
                await store.append(STREAM, events, start)
        for r in range(args.rounds):
            for work in WORKS:
                ways = _ways(work, args, directory, filled)
                order = WAYS[r % len(WAYS) :] + WAYS[: r % len(WAYS)]
                for way in order:
                    if way in ways:
                        rates[work][way].append(await ways[way]())
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    result: dict[str, Any] = {
        "sqlite": sqlite3.sqlite_version,
        "aiosqlite": _version("aiosqlite"),
        "rounds": args.rounds,
        "events": {
            "single": args.single,
            "batch": args.batches * 100,
            "stream": args.stream,
            "lookups": args.lookups,
        },
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }
    for work, what in WORKS.items():
        figures: dict[str, Any] = {"what": what}
        base = rates[work]["aiosqlite"]
        for way in WAYS:
            mine = rates[work][way]
            figures[way] = (
                None
                if not mine
                else {
                    "median": round(statistics.median(mine), 1),
                    "over_aiosqlite": round(
                        statistics.median(m / b for m, b in zip(mine, base, strict=True)), 2
                    ),
                    "runs": [round(m, 1) for m in mine],
                }
            )
        result[work] = figures
    return result


def _version(name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--single", type=int, default=500, help="events appended one per commit")
    parser.add_argument("--batches", type=int, default=100, help="100-event batches appended")
    parser.add_argument("--stream", type=int, default=10_000, help="events in the stream read back")
    parser.add_argument("--lookups", type=int, default=2000, help="short look-ups")
    parser.add_argument(
        "--rounds", type=int, default=8, help="a multiple of 4 lets each way lead equally often"
    )
    parser.add_argument("--dir", default=None, help="where the databases go (default: the temp directory)")
    args = parser.parse_args(argv)
    try:
        import aiosqlite  # noqa: F401
    except ImportError:
        print(
            "needs aiosqlite (pip install aiosqlite): it is the peer here, not a dependency", file=sys.stderr
        )
        return 2
    print(json.dumps(anyio.run(run, args), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
