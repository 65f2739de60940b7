"""Benchmark the SQLite log against ``eventsourcing``'s SQLite recorder in the same run, read scaling, CLI start-up.

    python tools/bench_log_sqlite.py                       # full run (scaling up to 1M events)
    python tools/bench_log_sqlite.py --scale 10000 100000 --runs 3   # a quicker look

Prints one JSON document. Every figure is a median of ``--runs`` interleaved runs beside its peer or limit,
measured in the same run, with the ratio and the target from issue 9:

- ``single_append``: one event per durable append, one writer, vs the peer recorder's ``insert_events`` of one
  event (target: faster), with ``single_append_profile``: CPU time and WAL pages per append of both, and
  ``code_per_event``: the store's own code per event, beside plain sqlite3 writing the same rows without fsync;
- ``batch_100``: 100-event batches vs the peer's 100-event ``insert_events`` (target: >= 1x);
- ``read_all``: ``read_all`` to envelopes vs the peer's ``select_notifications`` to ``Notification`` objects,
  both in pages of 4096 (target: >= 3x), with its limit: plain sqlite3 fetching the same columns as tuples;
- ``scaling``: for logs of each ``--scale`` size, reading one 10-event stream and ``read_all(from, limit=1)``
  at the middle of the log, in ms (the cost should not grow with the log);
- ``cli_startup``: ``loopd-es read --limit 1`` and ``loopd-es --help`` vs ``python -c pass`` (target: <= 3x).

``eventsourcing`` is a benchmark-only peer (``pip install eventsourcing``), not a dependency.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import msgspec

from loopd_es.events.envelope import NewEvent
from loopd_es.log import open_store

PAYLOAD = {"goal_id": "g-000123", "summary": "s" * 120, "turn": 7}
TYPE = "goal.progress"
PAGE = 4096


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _figure(
    unit: str, mine: list[float], peer: list[float], target: str, ok: Callable[[float], bool]
) -> dict[str, Any]:
    ratio = _median([m / p for m, p in zip(mine, peer, strict=True)])
    return {
        "unit": unit,
        "loopd_es": round(_median(mine), 1),
        "peer": round(_median(peer), 1),
        "loopd_es_runs": [round(x, 1) for x in mine],
        "peer_runs": [round(x, 1) for x in peer],
        "ratio": round(ratio, 3),
        "target": target,
        "pass": ok(ratio),
    }


# -- loopd-es ---------------------------------------------------------------------------------------------


async def _mine_appends(path: Path, n: int, size: int, synchronous: str = "FULL") -> float:
    async with await open_store(f"sqlite:{path}?synchronous={synchronous}") as store:
        batches = [[NewEvent(type=TYPE, data=PAYLOAD) for _ in range(size)] for _ in range(n // size)]
        t = time.perf_counter()
        for version, batch in enumerate(batches):
            await store.append("stream-1", batch, version * size)
        return len(batches) * size / (time.perf_counter() - t)  # whole batches only


async def _mine_read(path: Path) -> float:
    async with await open_store(f"sqlite:{path}", create=False) as store:
        t = time.perf_counter()
        n = 0
        async for batch in store.read_batches():
            n += len(batch)
        return n / (time.perf_counter() - t)


def _raw_read(path: Path) -> float:
    """The read's limit: plain sqlite3 fetching the store's own columns a page at a time, as tuples (no
    envelope). When it is under 3x the peer, the ten columns of the row are what stands in the way."""
    import sqlite3

    from loopd_es.log.base import READ_BATCH
    from loopd_es.log.sqlite_ops import COLUMNS

    conn = sqlite3.connect(path)
    statement = f"SELECT {COLUMNS} FROM events WHERE position > ? ORDER BY position LIMIT ?"
    t = time.perf_counter()
    n, after = 0, 0
    while True:
        rows = conn.execute(statement, (after, READ_BATCH)).fetchall()
        n += len(rows)
        if len(rows) < READ_BATCH:
            break
        after = rows[-1][0]
    result = n / (time.perf_counter() - t)
    conn.close()
    return result


async def _fill(path: Path, total: int, streams: int) -> None:
    """A log of ``streams`` streams whose events are spread over the whole log (round-robin, 1,000 per append)."""
    async with await open_store(f"sqlite:{path}?synchronous=OFF") as store:
        rounds = total // streams
        for _ in range(rounds):
            for first in range(0, streams, 1000):
                writes = [
                    (f"s-{k}", [NewEvent(type=TYPE, data=PAYLOAD)])
                    for k in range(first, min(first + 1000, streams))
                ]
                await store.append_many(writes)


async def _mine_scaling(path: Path, total: int, streams: int) -> tuple[float, float]:
    async with await open_store(f"sqlite:{path}", create=False) as store:
        stream = f"s-{streams // 2}"
        t = time.perf_counter()
        found = [e async for e in store.read_stream(stream, limit=10)]
        one_stream = (time.perf_counter() - t) * 1000
        assert len(found) == 10
        t = time.perf_counter()
        found = [e async for e in store.read_all(total // 2, limit=1)]
        bounded = (time.perf_counter() - t) * 1000
        assert len(found) == 1
        return one_stream, bounded


# -- the raw limit: loopd-es's own row, inserted by plain sqlite3 -------------------------------------------


def _raw_own_row(path: Path, n: int, size: int, synchronous: str = "FULL") -> float:
    """Plain sqlite3 inserting exactly the rows an append writes (the log's schema, WAL, ``synchronous=FULL``,
    time-ordered ids, checksums computed beforehand): one autocommit INSERT per single event, one
    multi-row INSERT per batch. No store can append faster than this; when it is no faster than the peer, the
    row itself (three b-trees: positions, the unique event ids the peer does not keep, stream versions) is
    what stands between the store and a ratio above 1."""
    from loopd_es.events.envelope import new_event_id
    from loopd_es.log.sqlite_ops import _SCHEMA, INSERT, row_crc

    def row(i: int, data: bytes) -> tuple[Any, ...]:
        fields = (i, "stream-1", i, new_event_id(), TYPE, 1, "2026-12-04T05:00:00.123456Z", None, None, data)
        return (*fields, row_crc(*fields))

    return raw_rows(path, n, size, _SCHEMA, INSERT, row, synchronous)


def raw_rows(
    path: Path,
    n: int,
    size: int,
    schema: str,
    insert: str,
    row: Callable[[int, bytes], tuple[Any, ...]],
    synchronous: str = "FULL",
) -> float:
    """Events/s of plain sqlite3 inserting ``n`` rows (``row(i, payload)``) into a new table (``schema``) at
    ``path``, ``size`` per commit: the statements the store's fast path runs, one autocommit INSERT per single
    event, one multi-row INSERT per batch (atomic on its own, and cheaper than a transaction around
    executemany). WAL, ``synchronous=FULL`` unless told otherwise."""
    import sqlite3

    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    conn.execute(schema)
    data = msgspec.json.encode(PAYLOAD)
    n -= n % size  # whole batches only, as the store's side appends them
    rows = [row(i, data) for i in range(1, n + 1)]
    head, one = insert.split(" VALUES ")
    statement = f"{head} VALUES {','.join([one] * size)}"
    commits = [tuple(v for r in rows[k : k + size] for v in r) for k in range(0, n, size)]
    t = time.perf_counter()
    for args in commits:
        conn.execute(statement, args)
    result = n / (time.perf_counter() - t)
    conn.close()
    return result


# -- the eventsourcing peer ------------------------------------------------------------------------------


def _peer_recorder(path: Path) -> Any:
    from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteDatastore

    datastore = SQLiteDatastore(str(path))
    recorder = SQLiteApplicationRecorder(datastore)
    recorder.create_table()
    return datastore, recorder


def _peer_appends(path: Path, n: int, size: int) -> float:
    from eventsourcing.persistence import StoredEvent

    datastore, recorder = _peer_recorder(path)
    originator = uuid.uuid4()
    state = msgspec.json.encode(PAYLOAD)
    batches = [
        [
            StoredEvent(originator_id=originator, originator_version=b * size + i, topic=TYPE, state=state)
            for i in range(size)
        ]
        for b in range(n // size)
    ]
    t = time.perf_counter()
    for batch in batches:
        recorder.insert_events(batch)
    result = len(batches) * size / (time.perf_counter() - t)  # whole batches only
    datastore.close()
    return result


def _peer_read(path: Path) -> float:
    datastore, recorder = _peer_recorder(path)
    t = time.perf_counter()
    n = 0
    start = 1
    while True:
        page = recorder.select_notifications(start, PAGE)
        n += len(page)
        if len(page) < PAGE:
            break
        start = page[-1].id + 1
    result = n / (time.perf_counter() - t)
    datastore.close()
    return result


# -- where a single append's time goes -------------------------------------------------------------------


async def _mine_profile(path: Path, n: int) -> tuple[float, float]:
    async with await open_store(f"sqlite:{path}") as store:
        events = [NewEvent(type=TYPE, data=PAYLOAD) for _ in range(n)]
        cpu = time.process_time()
        for version, event in enumerate(events):
            await store.append("stream-1", [event], version)
        cpu = time.process_time() - cpu
        return cpu, os.stat(f"{path}-wal").st_size  # a stat: nothing worth a thread here


def _peer_profile(path: Path, n: int) -> tuple[float, float]:
    from eventsourcing.persistence import StoredEvent

    datastore, recorder = _peer_recorder(path)
    originator, state = uuid.uuid4(), msgspec.json.encode(PAYLOAD)
    cpu = time.process_time()
    for version in range(n):
        recorder.insert_events(
            [StoredEvent(originator_id=originator, originator_version=version, topic=TYPE, state=state)]
        )
    cpu = time.process_time() - cpu
    size = Path(f"{path}-wal").stat().st_size
    datastore.close()
    return cpu, size


def single_append_profile(fresh: Callable[[str], Path], n: int) -> dict[str, Any]:
    """CPU time (this process, fsync waits excluded) and WAL bytes per durable single append, beside the
    peer's (what each commit writes; :func:`code_per_event` says what the store's own code costs).
    ``n`` stays under SQLite's 1,000-page auto-checkpoint, so the WAL holds every commit's frames."""
    mine_cpu, mine_wal = anyio.run(_mine_profile, fresh("profile-mine"), n)
    peer_cpu, peer_wal = _peer_profile(fresh("profile-peer"), n)
    page = 4096 + 24  # a WAL frame: one page and its header
    return {
        "appends": n,
        "cpu_us_per_append": {"loopd_es": round(mine_cpu / n * 1e6), "peer": round(peer_cpu / n * 1e6)},
        "wal_pages_per_append": {
            "loopd_es": round(mine_wal / n / page, 2),
            "peer": round(peer_wal / n / page, 2),
        },
    }


def code_per_event(fresh: Callable[[str], Path], single: int, batch_events: int, runs: int) -> dict[str, Any]:
    """Where an append's time goes besides the disk: the store and plain sqlite3 writing the same rows with
    ``synchronous=OFF`` (no fsync, so both are CPU alone), in µs per event, the minimum of ``runs`` (the least
    disturbed run of CPU-bound work). What the store takes beyond plain sqlite3 is its own code: the checks,
    the payloads' encoding, the envelopes and their checksums, the group commit."""
    out: dict[str, Any] = {"synchronous": "OFF", "runs": runs}
    for name, n, size in (("single_append", single, 1), ("batch_100", batch_events, 100)):
        stores, plains = [], []
        for _ in range(runs):  # interleaved, so that a neighbour's burst hits both alike
            stores.append(1e6 / anyio.run(_mine_appends, fresh("code-mine"), n, size, "OFF"))
            plains.append(1e6 / _raw_own_row(fresh("code-raw"), n, size, "OFF"))
        store, plain = min(stores), min(plains)
        out[name] = {
            "store_us_per_event": round(store, 2),
            "plain_sqlite3_us_per_event": round(plain, 2),
            "store_code_us_per_event": round(store - plain, 2),
        }
    return out


# -- CLI start-up ---------------------------------------------------------------------------------------


def _wall(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return (time.perf_counter() - t) * 1000


def cli_startup(base: Path, runs: int) -> dict[str, Any]:
    log = base / "cli.db"
    exe = shutil.which("loopd-es") or "loopd-es"
    subprocess.run(
        [
            exe,
            "--store",
            f"sqlite:{log}",
            "append",
            "--stream",
            "s",
            "--type",
            "goal.paused",
            "--data",
            '{"goal_id":"g"}',
        ],
        check=True,
        capture_output=True,
    )
    bare, read, helps = [], [], []
    for _ in range(runs):  # interleaved, so a noisy neighbour hits all three alike
        bare.append(_wall([sys.executable, "-c", "pass"]))
        read.append(_wall([exe, "--store", f"sqlite:{log}", "read", "--limit", "1"]))
        helps.append(_wall([exe, "--help"]))
    out = {}
    for name, values in (("read_limit_1", read), ("help", helps)):
        out[name] = _figure("ms", values, bare, "<= 3x python -c pass", lambda r: r <= 3.0)
        out[name]["peer_what"] = "python -c pass"
    return out


# -- the run --------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    base = Path(args.dir or tempfile.mkdtemp(prefix="bench-log-sqlite-"))
    base.mkdir(parents=True, exist_ok=True)
    say = sys.stderr.write
    out: dict[str, Any] = {"params": vars(args).copy(), "cpus": os.cpu_count()}

    def fresh(name: str) -> Path:
        return base / f"{name}-{uuid.uuid4().hex}.db"

    for name, n, size in (("single_append", args.single, 1), ("batch_100", args.batch_events, 100)):
        say(f"{name}...\n")
        mine, peer, raw = [], [], []
        for _ in range(args.runs):
            mine.append(anyio.run(_mine_appends, fresh("mine"), n, size))
            peer.append(_peer_appends(fresh("peer"), n, size))
            raw.append(_raw_own_row(fresh("raw"), n, size))
        target, ok = (
            ("faster than the peer", (lambda r: r > 1.0))
            if size == 1
            else (">= the peer", lambda r: r >= 1.0)
        )
        out[name] = _figure("events/s", mine, peer, target, ok)
        out[name]["raw_own_row"] = round(_median(raw), 1)
        out[name]["raw_own_row_runs"] = [round(x, 1) for x in raw]
        out[name]["raw_own_row_over_peer"] = round(
            _median([w / p for w, p in zip(raw, peer, strict=True)]), 3
        )
        out[name]["loopd_es_over_raw_own_row"] = round(
            _median([m / w for m, w in zip(mine, raw, strict=True)]), 3
        )
    out["single_append_profile"] = single_append_profile(fresh, 200)
    out["code_per_event"] = code_per_event(fresh, args.single, args.batch_events, max(args.runs, 5))

    say("read_all...\n")
    mine_log, peer_log = fresh("mine-read"), fresh("peer-read")
    anyio.run(_mine_appends, mine_log, args.read_events, 1000)
    _peer_appends(peer_log, args.read_events, 1000)
    mine, peer, raw = [], [], []
    for _ in range(args.runs):
        mine.append(anyio.run(_mine_read, mine_log))
        peer.append(_peer_read(peer_log))
        raw.append(_raw_read(mine_log))
    out["read_all"] = _figure(
        "events/s", mine, peer, ">= 3x the peer's select_notifications", lambda r: r >= 3.0
    )
    out["read_all"]["raw_own_row"] = round(_median(raw), 1)
    out["read_all"]["raw_own_row_runs"] = [round(x, 1) for x in raw]
    out["read_all"]["raw_own_row_over_peer"] = round(
        _median([w / p for w, p in zip(raw, peer, strict=True)]), 3
    )
    out["read_all"]["loopd_es_over_raw_own_row"] = round(
        _median([m / w for m, w in zip(mine, raw, strict=True)]), 3
    )

    out["scaling"] = {}
    for total in args.scale:
        say(f"scaling {total}...\n")
        path = fresh(f"scale-{total}")
        streams = max(1, total // 10)
        anyio.run(_fill, path, total, streams)
        samples = [anyio.run(_mine_scaling, path, total, streams) for _ in range(max(args.runs, 5))]
        out["scaling"][str(total)] = {
            "read_10_event_stream_ms": round(_median([s for s, _ in samples]), 3),
            "read_all_limit_1_ms": round(_median([b for _, b in samples]), 3),
        }
        path.unlink()
    say("cli start-up...\n")
    out["cli_startup"] = cli_startup(base, max(args.runs, 7))
    if not args.dir:
        shutil.rmtree(base, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--single", type=int, default=2000, help="single-event appends per run")
    parser.add_argument(
        "--batch-events", type=int, default=50_000, help="events per run of 100-event batches"
    )
    parser.add_argument("--read-events", type=int, default=200_000, help="events in the log read by read_all")
    parser.add_argument(
        "--scale", type=int, nargs="+", default=[10_000, 100_000, 1_000_000], help="log sizes"
    )
    parser.add_argument("--runs", type=int, default=5, help="interleaved runs per figure; medians reported")
    parser.add_argument("--dir", default=None, help="where to put the logs (default: a new temp dir)")
    print(json.dumps(run(parser.parse_args(argv)), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
