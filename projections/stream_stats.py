"""``stream_stats``: how many events of each type every stream holds, and where the last one is.

The example read model that proves the projector machinery: it needs only envelopes (never the payload),
has a batch fast path, and is cheap enough to rebuild a million-event log in a few seconds.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from loopd_es.events.envelope import Envelope

_STREAM: Final = attrgetter("stream")
_TYPE: Final = attrgetter("type")
_POSITION: Final = attrgetter("position")
_UPSERT: Final = """
INSERT INTO stream_stats (stream, type, events, first_position, last_position, last_recorded_at)
VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (stream, type) DO UPDATE SET
    events = events + excluded.events,
    last_position = excluded.last_position,
    last_recorded_at = excluded.last_recorded_at
"""


class StreamStats:
    """Rows of ``stream_stats``: (stream, type) -> events, first_position, last_position, last_recorded_at."""

    name = "stream_stats"
    version = 1
    rebuild_cost = 1.6  # CPU s per 1M events of tools/bench_rebuild.py, alone: balances a parallel rebuild

    def schema(self, conn: sqlite3.Connection) -> None:
        conn.execute(
            """CREATE TABLE IF NOT EXISTS stream_stats (
                stream TEXT NOT NULL, type TEXT NOT NULL, events INTEGER NOT NULL,
                first_position INTEGER NOT NULL, last_position INTEGER NOT NULL, last_recorded_at TEXT NOT NULL,
                PRIMARY KEY (stream, type)
            ) WITHOUT ROWID"""
        )

    def apply(self, conn: sqlite3.Connection, envelope: Envelope) -> None:
        e = envelope
        conn.execute(_UPSERT, (e.stream, e.type, 1, e.position, e.position, e.recorded_at))

    def apply_batch(self, conn: sqlite3.Connection, envelopes: Sequence[Envelope]) -> None:
        """Fold the batch in memory first: one upsert per (stream, type) instead of one per event.

        The counting runs in C (``Counter``, ``dict(zip(...))``): a Python loop per event cost more than
        the upserts.
        """
        keys = list(zip(map(_STREAM, envelopes), map(_TYPE, envelopes), strict=True))
        counts = Counter(keys)
        lasts = dict(zip(keys, envelopes, strict=True))
        firsts = dict(zip(reversed(keys), map(_POSITION, reversed(envelopes)), strict=True))
        conn.executemany(
            _UPSERT,
            [(k[0], k[1], n, firsts[k], lasts[k].position, lasts[k].recorded_at) for k, n in counts.items()],
        )

    def reset(self, conn: sqlite3.Connection) -> None:
        conn.execute("DROP TABLE IF EXISTS stream_stats")
