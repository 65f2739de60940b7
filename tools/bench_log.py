"""Benchmark the log backends against the physical limits of this machine, measured in the same run.

    python tools/bench_log.py                 # full run: 1M-event log for (e), 3 runs each, medians
    python tools/bench_log.py --events 100000 --runs 1   # a quick look

Prints one JSON document: per backend (ndjson, sqlite) and per figure (a)-(e), the store's rate, the physical
limit measured in this run, their ratio, the target from issue 2 and whether it passes:

(a) single-event durable appends, one writer      vs. a raw write+fdatasync loop / raw sqlite3, 1 event per commit
(b) 16 concurrent single-event writer tasks       vs. (a) of the same backend (target: >= 5x)
(c) 100-event batches                             vs. a minimal Python writer of the same bytes / sqlite3
(d) read_all decoded to envelopes                 vs. raw read + msgspec decode / raw sqlite3 select
(e) one 10k-event stream out of a 1M-event log, open included (ms)
(f) NDJSON: 10k -> 100k -> 1M events: a 10-event stream, read_all(limit=1), the first append, a CLI append
(g) NDJSON: durable appends of 4 writer processes vs one, beside raw fdatasync processes
(h) NDJSON: CPU microseconds per event of the store and of a minimal Python writer (the per-event profile)

plus the ``eventsourcing`` library's SQLite append rate for (a), when that library is installed (it is a
benchmark-only peer, not a dependency: ``pip install eventsourcing``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import msgspec

from loopd_es.clock import now_rfc3339
from loopd_es.events.envelope import (
    ENVELOPE_DECODER,
    ENVELOPE_ENCODER,
    Envelope,
    NewEvent,
    new_event_id,
)
from loopd_es.log import open_store

PAYLOAD = {"goal_id": "g-000123", "summary": "s" * 120, "turn": 7}
TYPE = "goal.progress"
CONCURRENCY = 16
BATCH = 100
STREAM_EVENTS = 10_000

TARGETS: dict[str, dict[str, tuple[str, float]]] = {
    # figure -> backend -> (how the target reads, threshold); ratios for a/b, absolute for c/d, ms for e
    "a_single_append": {
        "ndjson": ("ratio >= 0.85 of raw write+fsync", 0.85),
        "sqlite": ("ratio >= 0.6 of raw sqlite3", 0.6),
    },
    "b_concurrent_16": {
        "ndjson": (">= 5x single-writer rate", 5.0),
        "sqlite": (">= 5x single-writer rate", 5.0),
    },
    "c_batch_100": {
        "ndjson": ("ratio >= 0.95 of the minimal Python writer of the same bytes", 0.95),
        "sqlite": (">= 150000 events/s", 150_000),
    },
    "d_read_all": {"ndjson": (">= 500000 events/s", 500_000), "sqlite": (">= 500000 events/s", 500_000)},
    "e_stream_from_big_log": {"ndjson": ("< 300 ms", 300.0), "sqlite": ("< 100 ms", 100.0)},
}


def new_event(i: int) -> NewEvent:
    return NewEvent(type=TYPE, data={**PAYLOAD, "turn": i})


def sample_line() -> bytes:
    """One encoded envelope as the NDJSON backend writes it, for same-size raw writes."""
    env = Envelope(
        position=123_456, stream="bench-0", version=1234, event_id=str(uuid.uuid4()), type=TYPE,
        schema_version=1, recorded_at=now_rfc3339(), causation_id=None, correlation_id=None,
        data=msgspec.Raw(msgspec.json.encode(PAYLOAD)),
    )  # fmt: skip
    return ENVELOPE_ENCODER.encode(env) + b"\n"


def median_of(runs: int, measure: Callable[[], float]) -> tuple[float, list[float]]:
    values = [measure() for _ in range(runs)]
    return statistics.median(values), values


def rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


# -- physical limits ------------------------------------------------------------------------------


def raw_file_appends(directory: Path, n: int, per_sync: int, sync: Callable[[int], None]) -> float:
    """Events/s of os.write of same-size lines with one ``sync`` every ``per_sync`` lines."""
    line = sample_line()
    path = directory / f"raw-{uuid.uuid4().hex}.ndjson"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        chunk = line * per_sync
        t = time.perf_counter()
        for _ in range(n // per_sync):
            os.write(fd, chunk)
            sync(fd)
        return rate(n // per_sync * per_sync, time.perf_counter() - t)
    finally:
        os.close(fd)
        path.unlink()


def raw_sqlite(path: Path) -> sqlite3.Connection:
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=FULL")
    con.execute(
        "CREATE TABLE IF NOT EXISTS events (position INTEGER PRIMARY KEY, stream TEXT NOT NULL, "
        "version INTEGER NOT NULL, event_id TEXT NOT NULL UNIQUE, type TEXT NOT NULL, "
        "schema_version INTEGER NOT NULL, recorded_at TEXT NOT NULL, causation_id TEXT, "
        "correlation_id TEXT, data BLOB NOT NULL, UNIQUE (stream, version))"
    )
    return con


def raw_sqlite_rows(start: int, n: int, stream: str, first_version: int) -> list[tuple[Any, ...]]:
    """Rows for positions ``start``.. of ``stream`` from ``first_version`` on, with the store's own event ids
    (time-ordered, so the event-id index grows at its end in both)."""
    data = msgspec.json.encode(PAYLOAD)
    return [
        (start + i, stream, first_version + i, new_event_id(), TYPE, 1, now_rfc3339(), None, None, data)
        for i in range(n)
    ]


def raw_sqlite_inserts(directory: Path, n: int, per_commit: int) -> float:
    path = directory / f"raw-{uuid.uuid4().hex}.db"
    con = raw_sqlite(path)
    try:
        rows = raw_sqlite_rows(1, n, "bench-0", 1)
        t = time.perf_counter()
        for i in range(0, n, per_commit):
            con.execute("BEGIN IMMEDIATE")
            con.executemany("INSERT INTO events VALUES (?,?,?,?,?,?,?,?,?,?)", rows[i : i + per_commit])
            con.execute("COMMIT")
        return rate(n, time.perf_counter() - t)
    finally:
        con.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)


def raw_ndjson_read(path: Path) -> float:
    """Events/s of reading an NDJSON log and decoding every line to an Envelope, with no store around it."""
    t = time.perf_counter()
    n = 0
    with path.open("rb") as f:
        while chunk := f.readlines(1 << 22):
            for line in chunk:
                ENVELOPE_DECODER.decode(line)
                n += 1
    return rate(n, time.perf_counter() - t)


def raw_sqlite_read(path: Path) -> float:
    con = sqlite3.connect(path)
    try:
        t = time.perf_counter()
        n = 0
        cur = con.execute("SELECT * FROM events ORDER BY position")
        while rows := cur.fetchmany(4096):
            for r in rows:
                Envelope(
                    position=r[0], stream=r[1], version=r[2], event_id=r[3], type=r[4], schema_version=r[5],
                    recorded_at=r[6], causation_id=r[7], correlation_id=r[8], data=msgspec.Raw(r[9]),
                )  # fmt: skip
                n += 1
        return rate(n, time.perf_counter() - t)
    finally:
        con.close()


# -- the store ------------------------------------------------------------------------------------


async def store_single(url: str, n: int) -> float:
    async with await open_store(url) as store:
        await store.append("warm-up", [new_event(0)])
        events = [new_event(i) for i in range(n)]
        t = time.perf_counter()
        for i, e in enumerate(events):
            await store.append("bench-0", [e], i)
        return rate(n, time.perf_counter() - t)


async def store_concurrent(url: str, n: int, tasks: int) -> float:
    async with await open_store(url) as store:
        await store.append("warm-up", [new_event(0)])
        per_task = n // tasks

        async def writer(w: int) -> None:
            for i in range(per_task):
                await store.append(f"bench-{w}", [new_event(i)], i)

        t = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for w in range(tasks):
                tg.start_soon(writer, w)
        return rate(per_task * tasks, time.perf_counter() - t)


async def store_batches(url: str, n: int, size: int) -> float:
    async with await open_store(url) as store:
        batches = [[new_event(i + k) for k in range(size)] for i in range(0, n, size)]
        t = time.perf_counter()
        for b, batch in enumerate(batches):
            await store.append("bench-0", batch, b * size)
        return rate(len(batches) * size, time.perf_counter() - t)


async def store_read_all(url: str) -> float:
    async with await open_store(url) as store:
        t = time.perf_counter()
        n = 0
        async for _ in store.read_all():
            n += 1
        return rate(n, time.perf_counter() - t)


async def build_big_log(url: str, total: int, streams: int, chunk: int) -> None:
    """``total`` events over ``streams`` streams, written in chunks of ``chunk`` events per stream in turn."""
    async with await open_store(url) as store:
        versions = [0] * streams
        written = 0
        s = 0
        while written < total:
            size = min(chunk, total - written)
            await store.append(
                f"stream-{s:04d}", [new_event(versions[s] + k) for k in range(size)], versions[s]
            )
            versions[s] += size
            written += size
            s = (s + 1) % streams


async def store_one_stream(url: str, stream: str) -> float:
    """Milliseconds to open the log and read one stream to the end."""
    t = time.perf_counter()
    async with await open_store(url) as store:
        n = 0
        async for _ in store.read_stream(stream):
            n += 1
    ms = (time.perf_counter() - t) * 1000
    if n != STREAM_EVENTS:
        raise RuntimeError(f"read {n} events of {stream}, expected {STREAM_EVENTS}")
    return ms


def raw_one_stream_ndjson(directory: Path, lines: list[bytes]) -> float:
    """Milliseconds to read and decode the stream's lines from a file holding only them (the ideal index)."""
    path = directory / "only-stream.ndjson"
    path.write_bytes(b"".join(lines))
    t = time.perf_counter()
    with path.open("rb") as f:
        for line in f:
            ENVELOPE_DECODER.decode(line)
    return (time.perf_counter() - t) * 1000


def raw_one_stream_sqlite(path: Path, stream: str) -> float:
    t = time.perf_counter()
    con = sqlite3.connect(path)
    try:
        for r in con.execute("SELECT * FROM events WHERE stream = ? ORDER BY version", (stream,)):
            Envelope(
                position=r[0], stream=r[1], version=r[2], event_id=r[3], type=r[4], schema_version=r[5],
                recorded_at=r[6], causation_id=r[7], correlation_id=r[8], data=msgspec.Raw(r[9]),
            )  # fmt: skip
    finally:
        con.close()
    return (time.perf_counter() - t) * 1000


def build_raw_big_sqlite(path: Path, total: int, streams: int, chunk: int) -> None:
    con = raw_sqlite(path)
    try:
        versions = [0] * streams
        p = 1
        s = 0
        con.execute("BEGIN")
        while p <= total:
            size = min(chunk, total - p + 1)
            rows = raw_sqlite_rows(p, size, f"stream-{s:04d}", versions[s] + 1)
            con.executemany("INSERT INTO events VALUES (?,?,?,?,?,?,?,?,?,?)", rows)
            versions[s] += size
            p += size
            s = (s + 1) % streams
        con.execute("COMMIT")
    finally:
        con.close()


# -- the eventsourcing peer -----------------------------------------------------------------------


def eventsourcing_single(directory: Path, n: int) -> float | str:
    try:
        from eventsourcing.persistence import StoredEvent
        from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteDatastore
    except ImportError:
        return "eventsourcing is not installed (pip install eventsourcing) - peer skipped"
    path = directory / f"es-{uuid.uuid4().hex}.db"
    datastore = SQLiteDatastore(str(path))
    recorder = SQLiteApplicationRecorder(datastore)
    recorder.create_table()
    originator = uuid.uuid4()
    state = msgspec.json.encode(PAYLOAD)  # one aggregate, versions 0, 1, 2 ...: the library's own append path
    t = time.perf_counter()
    for i in range(n):
        recorder.insert_events(
            [StoredEvent(originator_id=originator, originator_version=i, topic=TYPE, state=state)]
        )
    result = rate(n, time.perf_counter() - t)
    datastore.close()
    return result


# -- the run --------------------------------------------------------------------------------------


def verdict(figure: str, backend: str, value: float) -> dict[str, Any]:
    text, threshold = TARGETS[figure][backend]
    ok = value < threshold if figure == "e_stream_from_big_log" else value >= threshold
    return {"target": text, "pass": ok}


def url_of(backend: str, path: Path, **options: str) -> str:
    query = "&".join(f"{k}={v}" for k, v in options.items())
    return f"{backend}:{path}" + (f"?{query}" if query else "")


def _measure(unit: str, values: tuple[float, list[float]]) -> dict[str, Any]:
    return {"value": round(values[0], 1), "runs": [round(v, 1) for v in values[1]], "unit": unit}


def _store_rate(fn: Callable[..., Awaitable[float]], *a: Any) -> Callable[[], float]:
    return lambda: anyio.run(fn, *a)


class Bench:
    """One run: the physical limits first, then figures (a)-(e) per backend."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.base = Path(args.dir)
        self.base.mkdir(parents=True, exist_ok=True)
        self.runs: int = args.runs
        self.n1: int = args.single
        self.nb: int = args.batch_events
        self.raw: dict[str, dict[str, float]] = {}
        self.es_rate: float | None = None

    def fresh(self, backend: str, **options: str) -> str:
        suffix = ".ndjson" if backend == "ndjson" else ".db"
        return url_of(backend, self.base / f"{backend}-{uuid.uuid4().hex}{suffix}", **options)

    @staticmethod
    def fast(backend: str) -> dict[str, str]:
        """Options for logs that are only built to be read: durability does not matter there."""
        return {"durability": "none"} if backend == "ndjson" else {"synchronous": "OFF"}

    def physical(self) -> dict[str, Any]:
        base, runs, n1, nb = self.base, self.runs, self.n1, self.nb
        fsync_rate = median_of(runs, lambda: raw_file_appends(base, n1, 1, os.fsync))
        fdatasync_rate = median_of(runs, lambda: raw_file_appends(base, n1, 1, os.fdatasync))
        batch_rate = median_of(runs, lambda: raw_file_appends(base, nb, BATCH, os.fdatasync))
        sql_1 = median_of(runs, lambda: raw_sqlite_inserts(base, n1, 1))
        sql_100 = median_of(runs, lambda: raw_sqlite_inserts(base, nb, BATCH))
        self.raw = {
            "ndjson": {"a": fdatasync_rate[0], "c": batch_rate[0]},  # the store syncs with fdatasync too
            "sqlite": {"a": sql_1[0], "c": sql_100[0]},
        }
        return {
            "write_fsync_1": _measure("events/s", fsync_rate),
            "write_fdatasync_1": _measure("events/s", fdatasync_rate),
            "write_fdatasync_per_100": _measure("events/s", batch_rate),
            "sqlite3_1_per_tx": _measure("events/s", sql_1),
            "sqlite3_100_per_tx": _measure("events/s", sql_100),
        }

    def peer(self) -> dict[str, Any]:
        es = [eventsourcing_single(self.base, self.n1) for _ in range(self.runs)]
        nums = [x for x in es if isinstance(x, float)]
        if len(nums) != len(es):
            return {"skipped": next(x for x in es if isinstance(x, str))}
        self.es_rate = statistics.median(nums)
        return _measure("events/s", (self.es_rate, nums))

    def a_single_append(self, backend: str, res: dict[str, Any]) -> dict[str, Any]:
        # Neighbours make this machine noisy, so each run measures the limit (and the peer) right beside
        # the store, and the verdict uses the median of the per-run ratios.
        base, n1 = self.base, self.n1
        stores, limits, peers = [], [], []
        for _ in range(self.runs):
            if backend == "ndjson":
                limits.append(raw_file_appends(base, n1, 1, os.fdatasync))
            else:
                limits.append(raw_sqlite_inserts(base, n1, 1))
            stores.append(anyio.run(store_single, self.fresh(backend), n1))
            if backend == "sqlite" and self.es_rate is not None:
                peer = eventsourcing_single(base, n1)
                if isinstance(peer, float):
                    peers.append(peer)
        value = statistics.median(stores)
        r = _measure("events/s", (value, stores))
        r["physical"] = round(statistics.median(limits), 1)
        r["physical_runs"] = [round(x, 1) for x in limits]
        r["ratio"] = round(statistics.median(s / lim for s, lim in zip(stores, limits, strict=True)), 3)
        r.update(verdict("a_single_append", backend, r["ratio"]))
        if backend == "sqlite":
            if not peers:
                r["vs_eventsourcing"] = "skipped: eventsourcing not installed"
            else:
                r["eventsourcing"] = round(statistics.median(peers), 1)
                r["eventsourcing_runs"] = [round(x, 1) for x in peers]
                ratio = statistics.median(s / p for s, p in zip(stores, peers, strict=True))
                r["ratio_vs_eventsourcing"] = round(ratio, 3)
                r["faster_than_eventsourcing"] = ratio > 1
                r["pass"] = r["pass"] and r["faster_than_eventsourcing"]
                r["target"] += " and faster than eventsourcing"
        return r

    def b_concurrent_16(self, backend: str, res: dict[str, Any]) -> dict[str, Any]:
        n = self.n1 * 2
        value = median_of(self.runs, lambda: anyio.run(store_concurrent, self.fresh(backend), n, CONCURRENCY))
        r = _measure("events/s", value)
        single = res.get("a_single_append", {}).get("value")
        if not single:
            raise RuntimeError("figure (a) failed, so (b) has no baseline")
        r["single_writer"] = single
        r["ratio"] = round(value[0] / single, 3)
        r["physical_write_fsync_1"] = round(self.raw[backend]["a"], 1)
        r.update(verdict("b_concurrent_16", backend, r["ratio"]))
        return r

    def c_batch_100(self, backend: str, res: dict[str, Any]) -> dict[str, Any]:
        if backend == "ndjson":
            return self._c_batch_ndjson()
        value = median_of(self.runs, lambda: anyio.run(store_batches, self.fresh(backend), self.nb, BATCH))
        r = _measure("events/s", value)
        r["physical"] = round(self.raw[backend]["c"], 1)
        r["ratio"] = round(value[0] / self.raw[backend]["c"], 3)
        r.update(verdict("c_batch_100", backend, value[0]))
        return r

    def _c_batch_ndjson(self) -> dict[str, Any]:
        """The store beside the minimal Python writer of the same bytes, interleaved run by run."""
        from bench_log_ndjson import minimal_writer

        stores, minimal = [], []
        for _ in range(self.runs):
            minimal.append(minimal_writer(self.base / f"minimal-{uuid.uuid4().hex}", self.nb, BATCH))
            stores.append(anyio.run(store_batches, self.fresh("ndjson"), self.nb, BATCH))
        r = _measure("events/s", (statistics.median(stores), stores))
        r["minimal_python_writer"] = round(statistics.median(minimal), 1)
        r["minimal_python_writer_runs"] = [round(x, 1) for x in minimal]
        r["physical"] = round(self.raw["ndjson"]["c"], 1)
        r["ratio"] = round(statistics.median(s / m for s, m in zip(stores, minimal, strict=True)), 3)
        r.update(verdict("c_batch_100", "ndjson", r["ratio"]))
        return r

    def f_scaling(self, backend: str, res: dict[str, Any]) -> dict[str, Any]:
        from bench_log_ndjson import scaling

        return scaling(self.base, self.args.scale_sizes, max(self.runs, 3))

    def g_processes(self, backend: str, res: dict[str, Any]) -> dict[str, Any]:
        from bench_log_ndjson import processes

        return processes(self.base, self.args.process_events, self.runs)

    def h_profile(self, backend: str, res: dict[str, Any]) -> dict[str, Any]:
        from bench_log_ndjson import profile

        return {
            **profile(self.base, self.runs),
            "note": "a profile beside its peer, not a target",
            "pass": True,
        }

    def d_read_all(self, backend: str, res: dict[str, Any]) -> dict[str, Any]:
        n: int = self.args.read_events
        url = self.fresh(backend, **self.fast(backend))
        anyio.run(store_batches, url, n, min(10_000, n))
        value = median_of(self.runs, _store_rate(store_read_all, url))
        r = _measure("events/s", value)
        if backend == "ndjson":
            path = Path(url.split(":", 1)[1].split("?", 1)[0])
            physical = median_of(self.runs, lambda: raw_ndjson_read(path))
            r["physical_what"] = "read the file + msgspec decode of every line to Envelope"
        else:
            raw_path = self.base / f"raw-read-{uuid.uuid4().hex}.db"
            build_raw_big_sqlite(raw_path, n, 1, 10_000)
            physical = median_of(self.runs, lambda: raw_sqlite_read(raw_path))
            r["physical_what"] = "stdlib sqlite3 select of every row + Envelope construction"
        r["physical"] = round(physical[0], 1)
        r["ratio"] = round(value[0] / physical[0], 3)
        r["events"] = n
        r.update(verdict("d_read_all", backend, value[0]))
        return r

    def e_stream_from_big_log(self, backend: str, res: dict[str, Any]) -> dict[str, Any]:
        total: int = self.args.events
        streams = max(1, total // STREAM_EVENTS)
        url = self.fresh(backend, **self.fast(backend))
        t = time.perf_counter()
        anyio.run(build_big_log, url, total, streams, 1000)
        build_s = time.perf_counter() - t
        target = f"stream-{streams // 2:04d}"
        plain = url.split("?", 1)[0]  # reopen with the default (durable) options, as a user would
        runs = max(self.runs, 5)
        value = median_of(runs, _store_rate(store_one_stream, plain, target))
        r = _measure("ms", value)
        r["log_events"] = total
        r["build_seconds"] = round(build_s, 2)
        if backend == "ndjson":
            path = Path(plain.split(":", 1)[1])
            with path.open("rb") as f:
                mine = [line for line in f if f'"stream":"{target}"'.encode() in line]
            physical = median_of(runs, lambda: raw_one_stream_ndjson(self.base, mine))
            r["physical_what"] = "read + decode the stream's lines from a file holding only them"
        else:
            raw_path = self.base / f"raw-big-{uuid.uuid4().hex}.db"
            build_raw_big_sqlite(raw_path, total, streams, 1000)
            physical = median_of(runs, lambda: raw_one_stream_sqlite(raw_path, target))
            r["physical_what"] = (
                "stdlib sqlite3 connect + indexed select of the stream + Envelope construction"
            )
        r["physical"] = round(physical[0], 2)
        r["ratio"] = round(value[0] / physical[0], 3) if physical[0] else None
        r.update(verdict("e_stream_from_big_log", backend, value[0]))
        return r


FIGURES = (
    "a_single_append", "b_concurrent_16", "c_batch_100", "d_read_all", "e_stream_from_big_log",
    "f_scaling", "g_processes", "h_profile",
)  # fmt: skip
NDJSON_ONLY = (
    "f_scaling",
    "g_processes",
    "h_profile",
)  # issue 9: the NDJSON figures (tools/bench_log_ndjson.py)


def run(args: argparse.Namespace) -> dict[str, Any]:
    bench = Bench(args)
    log = sys.stderr.write
    out: dict[str, Any] = {
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
        },
        "params": {
            "runs": bench.runs,
            "single_appends": bench.n1,
            "concurrent_appends": bench.n1 * 2,
            "batch_events": bench.nb,
            "read_all_events": args.read_events,
            "big_log_events": args.events,
            "line_bytes": len(sample_line()),
        },
    }
    log("physical limits...\n")
    out["physical"] = bench.physical()
    log("eventsourcing peer...\n")
    out["peers"] = {"eventsourcing_sqlite_append": bench.peer()}
    out["results"] = {}
    for backend in args.backends:
        res: dict[str, Any] = {}
        out["results"][backend] = res
        for figure in FIGURES:
            if figure not in args.figures or (figure in NDJSON_ONLY and backend != "ndjson"):
                continue
            log(f"{backend} {figure}...\n")
            try:
                res[figure] = getattr(bench, figure)(backend, res)
            except Exception as e:  # one failing figure must not hide the others
                res[figure] = {"error": f"{type(e).__name__}: {e}", "pass": False}
    out["all_pass"] = all(f.get("pass", False) for b in out["results"].values() for f in b.values())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=1_000_000, help="size of the big log for (e)")
    parser.add_argument("--read-events", type=int, default=200_000, help="size of the log read for (d)")
    parser.add_argument("--single", type=int, default=2000, help="single-event appends per run for (a)")
    parser.add_argument("--batch-events", type=int, default=50_000, help="events per run for (c)")
    parser.add_argument("--runs", type=int, default=3, help="runs per figure; the median is reported")
    parser.add_argument("--backends", nargs="+", default=["ndjson", "sqlite"], choices=["ndjson", "sqlite"])
    parser.add_argument("--figures", nargs="+", default=list(FIGURES), choices=FIGURES)
    parser.add_argument(
        "--scale-sizes",
        type=lambda text: [int(x) for x in text.split(",")],
        default=[10_000, 100_000, 1_000_000],
        help="log sizes for (f), comma-separated",
    )
    parser.add_argument("--process-events", type=int, default=400, help="durable appends per run for (g)")
    parser.add_argument("--dir", default=None, help="where to put the logs (default: a new temp dir)")
    args = parser.parse_args(argv)
    if args.events < STREAM_EVENTS:
        parser.error(f"--events must be at least {STREAM_EVENTS}")
    created = args.dir is None
    if created:
        args.dir = tempfile.mkdtemp(prefix="loopd-bench-")
    try:
        result = run(args)
    finally:
        if created:
            shutil.rmtree(args.dir, ignore_errors=True)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
