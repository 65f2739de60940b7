"""What the row costs: plain ``sqlite3`` writing candidate row designs, beside ``eventsourcing``, in the same run.

    python tools/bench_sqlite_rows.py [--single 1000] [--batch-events 20000] [--rounds 12]

Issue 26 names levers for the SQLite append rows (the event id as a 16-byte BLOB, a leaner row). Changing the
log's row is a schema migration for every log on disk, so each lever is measured here first, without any store
code: the very INSERTs an append runs (one autocommit INSERT per single event, one multi-row INSERT of 100 rows per
batch, as the store's fast path does; WAL, ``synchronous=FULL``, time-ordered ids), on fresh files, in rotating order with the peer's recorder.
No store can append faster than plain ``sqlite3`` writing its row, so a design whose row is not well above the
peer here cannot give the store a ratio above the peer either.

Designs:

- ``log``: the log's row as it is (``sqlite_ops._SCHEMA``): position, stream, version, a 36-character TEXT event
  id under a UNIQUE index, type, schema version, time as text, causal links, payload, checksum;
- ``blob_id``: the same with the event id as its 16 bytes;
- ``blob_id_int_time``: that, with the time as integer microseconds (the leaner row);
- ``no_id_index``: the log's row without the UNIQUE index on event ids (what giving up the guarantee that an
  event id is recorded once in the whole log, which a retried append relies on, would buy);
- ``peer_row``: the peer's own row (originator, version, topic, state) written by plain ``sqlite3``: the
  peer's limit, so ``peer`` over it is the peer recorder's own overhead.

Prints one JSON document: per design and per work the median rate and the median of the per-round ratios
over the peer.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

# the peer's appends and the plain-sqlite3 writer, as the log's own benchmark runs them
from bench_log_sqlite import TYPE, _peer_appends, raw_rows

from loopd_es.events.envelope import new_event_id
from loopd_es.log.sqlite_ops import _SCHEMA, INSERT, row_crc

TIME = "2026-12-07T09:00:00.123456Z"
TIME_US = 1_796_634_000_123_456

Row = tuple[Any, ...]
Design = tuple[str, str, Callable[[int, bytes], Row]]
"""A table's schema, its INSERT, and how its ``i``-th row is made."""


def _log_row(i: int, data: bytes) -> Row:
    fields = (i, "stream-1", i, new_event_id(), TYPE, 1, TIME, None, None, data)
    return (*fields, row_crc(*fields))


def _blob_row(i: int, data: bytes) -> Row:
    fields = (i, "stream-1", i, uuid.UUID(new_event_id()).bytes, TYPE, 1, TIME, None, None, data)
    return (*fields, row_crc(i, "stream-1", i, "", TYPE, 1, TIME, None, None, data))


def _blob_int_row(i: int, data: bytes) -> Row:
    fields = (i, "stream-1", i, uuid.UUID(new_event_id()).bytes, TYPE, 1, TIME_US, None, None, data)
    return (*fields, row_crc(i, "stream-1", i, "", TYPE, 1, TIME, None, None, data))


_BLOB_SCHEMA = _SCHEMA.replace("event_id       TEXT", "event_id       BLOB")
_PEER_SCHEMA = (
    "CREATE TABLE stored_events (originator_id TEXT, originator_version INTEGER, topic TEXT, state BLOB,"
    " PRIMARY KEY (originator_id, originator_version))"
)
_PEER_ORIGINATOR = str(uuid.uuid4())

DESIGNS: dict[str, Design] = {
    "log": (_SCHEMA, INSERT, _log_row),
    "blob_id": (_BLOB_SCHEMA, INSERT, _blob_row),
    "blob_id_int_time": (
        _BLOB_SCHEMA.replace("recorded_at    TEXT", "recorded_at    INTEGER"),
        INSERT,
        _blob_int_row,
    ),
    "no_id_index": (_SCHEMA.replace("NOT NULL UNIQUE", "NOT NULL"), INSERT, _log_row),
    "peer_row": (
        _PEER_SCHEMA,
        "INSERT INTO stored_events VALUES (?,?,?,?)",
        lambda i, data: (_PEER_ORIGINATOR, i, TYPE, data),
    ),
}


def plain_rows(design: str, path: Path, n: int, size: int) -> float:
    """Events/s of plain ``sqlite3`` inserting ``n`` rows of ``design``, ``size`` per commit, at ``path``."""
    schema, insert, make = DESIGNS[design]
    return raw_rows(path, n, size, schema, insert, make)


def run(args: argparse.Namespace) -> dict[str, Any]:
    # whole batches only: every side writes the same number of events
    works = {
        "single_append": (args.single, 1),
        "batch_100": (args.batch_events - args.batch_events % 100, 100),
    }
    kinds = ["peer", *DESIGNS]
    rates: dict[str, dict[str, list[float]]] = {w: {k: [] for k in kinds} for w in works}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for r in range(args.rounds):
            for work, (n, size) in works.items():
                for kind in kinds[r % len(kinds) :] + kinds[: r % len(kinds)]:
                    path = Path(tmp) / f"{work}-{kind}-{r}.db"
                    got = _peer_appends(path, n, size) if kind == "peer" else plain_rows(kind, path, n, size)
                    rates[work][kind].append(got)
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    result: dict[str, Any] = {
        "sqlite": sqlite3.sqlite_version,
        "rounds": args.rounds,
        "events": {w: n for w, (n, _) in works.items()},
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }
    for work in works:
        peer = rates[work]["peer"]
        result[work] = {
            kind: {
                "median_per_s": round(statistics.median(got)),
                "over_peer": round(statistics.median(g / p for g, p in zip(got, peer, strict=True)), 3),
                "over_peer_runs": [round(g / p, 3) for g, p in zip(got, peer, strict=True)],
            }
            for kind, got in rates[work].items()
        }
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--single", type=int, default=1000, help="events appended one per commit")
    parser.add_argument("--batch-events", type=int, default=20_000, help="events appended 100 per commit")
    parser.add_argument(
        "--rounds", type=int, default=12, help="a multiple of 6 lets each of the six lead equally often"
    )
    parser.add_argument("--dir", default=None, help="where the databases go (default: the temp directory)")
    args = parser.parse_args(argv)
    try:
        import eventsourcing  # noqa: F401
    except ImportError:
        print("needs eventsourcing (pip install eventsourcing): the peer, not a dependency", file=sys.stderr)
        return 2
    print(json.dumps(run(args), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
