"""Benchmark the PostgreSQL log against raw psycopg inserts of the same rows, measured in the same run.

    eval "$(bash tools/pg_test_server.sh start)"
    python tools/bench_postgres.py --url "$LOOPD_ES_TEST_POSTGRES"            # 3 runs, medians
    python tools/bench_log.py --store "$LOOPD_ES_TEST_POSTGRES"               # the same, from the log benchmark

Prints one JSON document:

- appends/s with 1, 4 and 16 writer **processes**, single events and 100-event batches, each beside raw psycopg
  inserts of the same rows by the same number of processes (one autocommit INSERT per event, or one
  100-row transaction): the ratio is the store's cost over the database's own (target >= 0.7x);
- projector lag across processes woken by NOTIFY, p50/p99 (target p99 <= 20 ms);
- ``read_all`` decoded to envelopes, events/s (target >= 300k/s);
- beside each append figure, ``eventsourcing``'s PostgreSQL application recorder (``insert_events`` by the
  same number of processes, when that benchmark-only peer is installed): target >= 1.2x (issue 26).

Each figure runs in a schema of its own, dropped afterwards. Writer processes connect, say they are ready, start
together on the parent's word and each counts its own acknowledged events for a fixed time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import psycopg

from loopd_es.clock import now_rfc3339
from loopd_es.events.envelope import NewEvent
from loopd_es.log import open_store
from loopd_es.log.postgres_url import split_postgres_url

PAYLOAD = {"goal_id": "g-000123", "summary": "s" * 120, "turn": 7}
DATA = json.dumps(PAYLOAD, separators=(",", ":")).encode()
RAW_TABLE = """CREATE TABLE {schema}.raw_events (
    position BIGSERIAL PRIMARY KEY, stream TEXT NOT NULL, version BIGINT NOT NULL, event_id TEXT NOT NULL UNIQUE,
    type TEXT NOT NULL, schema_version INTEGER NOT NULL, recorded_at TEXT NOT NULL, causation_id TEXT,
    correlation_id TEXT, data BYTEA NOT NULL, UNIQUE (stream, version))"""
TARGET_RATIO = 0.7
TARGET_OVER_PEER = 1.2  # issue 26: ahead of eventsourcing's PostgreSQL recorder
TARGET_LAG_P99_MS = 20.0
TARGET_READ = 300_000.0


def schema_url(base: str) -> tuple[str, str]:
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    return f"{base}?schema={schema}", schema


def drop(base: str, schema: str) -> None:
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


# -- one writer process ----------------------------------------------------------------------------


async def store_writer(url: str, batch: int, seconds: float, worker: int) -> int:
    done = 0
    async with await open_store(url) as log:
        await ready_then_go()
        end = time.monotonic() + seconds
        stream = f"bench-{worker}"
        while time.monotonic() < end:
            await log.append(stream, [NewEvent(type="goal.progress", data=PAYLOAD) for _ in range(batch)])
            done += batch
    return done


def raw_writer(url: str, batch: int, seconds: float, worker: int) -> int:
    conninfo, schema = split_postgres_url(url)
    done = 0
    with psycopg.connect(conninfo, autocommit=True) as conn:
        insert = (
            f"INSERT INTO {schema}.raw_events (stream, version, event_id, type, schema_version, recorded_at,"
            " causation_id, correlation_id, data) VALUES (%s,%s,%s,%s,1,%s,NULL,NULL,%s)"
        )
        print("ready", flush=True)
        sys.stdin.readline()
        end = time.monotonic() + seconds
        version = 0
        while time.monotonic() < end:
            rows = []
            for _ in range(batch):
                version += 1
                rows.append(
                    (f"raw-{worker}", version, str(uuid.uuid4()), "goal.progress", now_rfc3339(), DATA)
                )
            if batch == 1:
                conn.execute(insert, rows[0])
            else:
                with conn.transaction(), conn.cursor() as cur:
                    cur.executemany(insert, rows)
            done += batch
    return done


def peer_writer(url: str, batch: int, seconds: float, worker: int) -> int:
    """``eventsourcing``'s PostgreSQL application recorder: ``insert_events`` of ``batch`` stored events."""
    from eventsourcing.persistence import StoredEvent

    _datastore, recorder = peer_recorder(url)
    originator = uuid.uuid4()
    done = 0
    print("ready", flush=True)
    sys.stdin.readline()
    end = time.monotonic() + seconds
    version = 0
    while time.monotonic() < end:
        events = []
        for _ in range(batch):
            version += 1
            events.append(
                StoredEvent(
                    originator_id=originator, originator_version=version, topic="goal.progress", state=DATA
                )
            )
        recorder.insert_events(events)
        done += batch
    return done


def peer_recorder(url: str, *, create: bool = False) -> tuple[Any, Any]:
    """The peer's datastore and recorder on the schema of ``url``; ``create`` makes its table (once, in the
    parent: concurrent ``CREATE TABLE IF NOT EXISTS`` can collide in PostgreSQL's catalogue)."""
    from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore

    conninfo, schema = split_postgres_url(url)
    info = psycopg.conninfo.conninfo_to_dict(conninfo)
    datastore = PostgresDatastore(
        str(info.get("dbname", "postgres")),
        str(info.get("host", "127.0.0.1")),
        str(info.get("port", 5432)),
        str(info.get("user", "postgres")),
        str(info.get("password", "")),
        schema=schema,
    )
    recorder = PostgresApplicationRecorder(datastore)
    if create:
        recorder.create_table()
    return datastore, recorder


async def ready_then_go() -> None:
    """Tell the parent this writer is connected, and wait for the word to start (a line on stdin)."""
    print("ready", flush=True)
    await anyio.to_thread.run_sync(sys.stdin.readline)


def worker_main(kind: str, url: str, batch: int, seconds: float, worker: int) -> None:
    if kind == "store":
        done = anyio.run(store_writer, url, batch, seconds, worker)
    elif kind == "peer":
        done = peer_writer(url, batch, seconds, worker)
    else:
        done = raw_writer(url, batch, seconds, worker)
    print(done, flush=True)


def writers(kind: str, base: str, processes: int, batch: int, seconds: float) -> float:
    """Events/s appended by ``processes`` writer processes of ``kind`` (store or raw) in a fresh schema."""
    url, schema = schema_url(base)
    try:
        if kind == "raw":
            with psycopg.connect(base, autocommit=True) as conn:
                conn.execute(f"CREATE SCHEMA {schema}")
                conn.execute(RAW_TABLE.format(schema=schema))
        elif kind == "peer":
            with psycopg.connect(base, autocommit=True) as conn:
                conn.execute(f"CREATE SCHEMA {schema}")
            datastore, _ = peer_recorder(url, create=True)
            datastore.close()
        else:
            anyio.run(_create, url)
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--worker", kind, url, str(batch), repr(seconds), str(i)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
            )
            for i in range(processes)
        ]
        for proc in procs:  # every writer connected before any starts: start-up is not measured
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                raise SystemExit(f"a {kind} writer did not start")
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        total = 0
        for proc in procs:
            out, _ = proc.communicate(timeout=seconds + 60)
            if proc.returncode:
                raise SystemExit(f"a {kind} writer failed with exit code {proc.returncode}")
            total += int(out.strip())
        return total / seconds
    finally:
        drop(base, schema)


async def _create(url: str) -> None:
    async with await open_store(url):
        pass


# -- projector lag across processes ----------------------------------------------------------------

APPENDER = """
import json, sys, time, anyio
from loopd_es.events.envelope import NewEvent
from loopd_es.log import open_store

async def main(url, count, gap):
    async with await open_store(url) as store:
        await anyio.sleep(0.5)
        for i in range(count):
            await anyio.sleep(gap)
            (env,) = await store.append(f"live-{i % 3}", [NewEvent(type="test.live", data={"i": i})])
            print(json.dumps({"position": env.position, "ack": time.monotonic()}), flush=True)

anyio.run(main, sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
"""


async def projector_lag(base: str, appends: int, directory: Path) -> list[float]:
    """Seconds from each append's acknowledgement in another process to its row in the read model."""
    from loopd_es.projector import BatchResult, Projector
    from projections import StreamStats

    url, schema = schema_url(base)
    visible: dict[int, float] = {}
    all_seen = anyio.Event()

    def committed(result: BatchResult, at: float) -> None:
        visible.setdefault(result.low, at)
        if result.low >= appends + 1:  # the warm-up event plus every append
            all_seen.set()

    try:
        async with await open_store(url) as store:
            await store.append("warm", [NewEvent(type="test.live", data={"i": -1})])
            async with await Projector.open(store, [StreamStats()], directory / f"{schema}.db") as projector:
                projector.on_commit = committed
                async with anyio.create_task_group() as tg:
                    tg.start_soon(lambda: projector.follow(poll_interval=30))
                    result = await anyio.run_process(
                        [sys.executable, "-c", APPENDER, url, str(appends), "0.005"],
                        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
                    )
                    with anyio.move_on_after(10):
                        await all_seen.wait()
                    tg.cancel_scope.cancel()
    finally:
        drop(base, schema)
    acks = [json.loads(line) for line in result.stdout.decode().splitlines()]
    return [max(min(at for low, at in visible.items() if low >= a["position"]) - a["ack"], 0.0) for a in acks]


# -- read_all ----------------------------------------------------------------------------------------


async def read_all_rate(base: str, events: int) -> float:
    url, schema = schema_url(base)
    try:
        async with await open_store(url) as store:
            batch = [NewEvent(type="goal.progress", data=PAYLOAD) for _ in range(1000)]
            for i in range(events // 1000):
                await store.append(f"s-{i % 50}", [NewEvent(type=e.type, data=e.data) for e in batch])
            best = []
            for _ in range(3):
                started = time.perf_counter()
                count = 0
                async for _env in store.read_all():
                    count += 1
                best.append(count / (time.perf_counter() - started))
            return statistics.median(best)
    finally:
        drop(base, schema)


def _lag(args: argparse.Namespace) -> dict[str, Any]:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        lags = anyio.run(projector_lag, args.url, args.lag_appends, Path(tmp))
    ms = sorted(x * 1000 for x in lags)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return {
        "p50": round(statistics.median(ms), 2),
        "p99": round(p99, 2),
        "max": round(ms[-1], 2),
        "samples": len(ms),
        "target": f"p99 <= {TARGET_LAG_P99_MS} ms",
        "pass": p99 <= TARGET_LAG_P99_MS,
    }


def _have_peer() -> bool:
    try:
        import eventsourcing.postgres  # noqa: F401
    except ImportError:
        return False
    return True


def run(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"url": args.url.split("@")[-1], "seconds_per_run": args.seconds, "runs": args.runs}
    appends: dict[str, Any] = {}
    kinds = ["raw", "store", "peer"] if _have_peer() else ["raw", "store"]
    for batch in (1, 100):
        for processes in args.processes:
            runs: dict[str, list[float]] = {kind: [] for kind in kinds}
            for r in range(args.runs):  # rotating order, so drift on a shared machine hits all alike
                for kind in kinds[r % len(kinds) :] + kinds[: r % len(kinds)]:
                    runs[kind].append(writers(kind, args.url, processes, batch, args.seconds))
            store, raw = statistics.median(runs["store"]), statistics.median(runs["raw"])
            figure: dict[str, Any] = {
                "store_per_s": round(store),
                "raw_psycopg_per_s": round(raw),
                "ratio": round(store / raw, 2),
                "target": f">= {TARGET_RATIO}x raw",
                "pass": store / raw >= TARGET_RATIO,
                "store_runs": [round(x) for x in runs["store"]],
                "raw_runs": [round(x) for x in runs["raw"]],
            }
            if "peer" in runs:
                over_peer = statistics.median(m / p for m, p in zip(runs["store"], runs["peer"], strict=True))
                figure |= {
                    "eventsourcing_per_s": round(statistics.median(runs["peer"])),
                    "eventsourcing_runs": [round(x) for x in runs["peer"]],
                    "ratio_over_eventsourcing": round(over_peer, 3),
                    "target_over_eventsourcing": f">= {TARGET_OVER_PEER}x",
                    "pass_over_eventsourcing": over_peer >= TARGET_OVER_PEER,
                }
            appends[f"batch{batch}_processes{processes}"] = figure
    out["appends"] = appends
    if not args.no_lag:
        out["projector_lag_ms"] = _lag(args)
    if not args.no_read:
        read = anyio.run(read_all_rate, args.url, args.read_events)
        out["read_all_decoded"] = {
            "events_per_s": round(read),
            "events": args.read_events,
            "target": f">= {TARGET_READ:.0f}/s",
            "pass": read >= TARGET_READ,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        kind, url, batch, seconds, worker = argv[1:]
        worker_main(kind, url, int(batch), float(seconds), int(worker))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("LOOPD_ES_TEST_POSTGRES", ""))
    parser.add_argument("--seconds", type=float, default=3.0, help="how long each writer run lasts")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--lag-appends", type=int, default=300)
    parser.add_argument("--read-events", type=int, default=100_000)
    parser.add_argument(
        "--processes", type=int, nargs="+", default=[1, 4, 16], help="writer process counts per figure"
    )
    parser.add_argument("--no-lag", action="store_true", help="skip the projector lag figure")
    parser.add_argument("--no-read", action="store_true", help="skip the read_all figure")
    args = parser.parse_args(argv)
    if not args.url:
        parser.error("no server: pass --url or start one with tools/pg_test_server.sh")
    print(json.dumps(run(args), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
