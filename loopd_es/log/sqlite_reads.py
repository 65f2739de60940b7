"""The SQLite backend's reads: envelopes, the rows a fold reads, heads and stream names.

Every function takes a plain :class:`sqlite3.Connection` and runs synchronously, on the event-loop thread
(the read-only connection) or on the store's one worker thread (:mod:`.sqlite`). Rows are built by unpacking
in a comprehension (about 100 ns a row cheaper than a call per row), and a read of one stream does not fetch
the stream's name.
"""

from __future__ import annotations

import sqlite3
import zlib
from collections.abc import Sequence
from itertools import starmap
from typing import Any, Final

import msgspec

from ..errors import CorruptLogError
from ..events.envelope import Envelope, LogRow, Recorded, StreamRows
from .base import MAX_POSITION
from .invariants import check_contiguous
from .sqlite_ops import _PACK, COLUMNS

_STREAM_COLUMNS: Final = COLUMNS.replace(" stream,", "")
_Raw: Final = msgspec.Raw


def read_rows(
    conn: sqlite3.Connection,
    stream: str | None,
    after: int,
    size: int,
    types: Sequence[str] | None = None,
    prefix: str | None = None,
    backwards: bool = False,
) -> list[Envelope]:
    """At most ``size`` envelopes after (or, ``backwards``, before) ``after``, filtered in SQL.

    ``after`` is a position, or a version with ``stream``; filtered-out rows are never decoded.
    """
    after = min(after, MAX_POSITION)
    key = "position" if stream is None else "version"
    where = [f"{key} {'<' if backwards else '>'} ?"]
    args: list[Any] = [after]
    if stream is not None:
        where.insert(0, "stream = ?")
        args.insert(0, stream)
    if types is not None:
        where.append(f"type IN ({','.join('?' * len(types))})")
        args.extend(types)
    if prefix:
        where.append("stream >= ? AND stream < ?")
        args.extend((prefix, prefix + "\U0010ffff"))
    order = "DESC" if backwards else ""
    raw = _Raw  # unpacking in a comprehension: about 100 ns a row cheaper than a call per row
    if stream is not None:  # one stream: its name is not fetched (and copied) once a row
        cursor = conn.execute(
            f"SELECT {_STREAM_COLUMNS} FROM events WHERE {' AND '.join(where)} ORDER BY version {order} LIMIT ?",
            (*args, size),
        )
        s = stream
        return [
            Envelope(p, s, v, i, t, sv, r, c, co, raw(d)) for p, v, i, t, sv, r, c, co, d in cursor.fetchall()
        ]
    cursor = conn.execute(
        f"SELECT {COLUMNS} FROM events WHERE {' AND '.join(where)} ORDER BY {key} {order} LIMIT ?",
        (*args, size),
    )
    return [
        Envelope(p, s, v, i, t, sv, r, c, co, raw(d)) for p, s, v, i, t, sv, r, c, co, d in cursor.fetchall()
    ]


def read_checked(
    conn: sqlite3.Connection,
    _stream: None,
    after: int,
    size: int,
    _types: None,
    _prefix: None,
    *,
    where: str,
    checked: bool,
) -> list[Envelope]:
    """At most ``size`` envelopes after position ``after``, each row's checksum (``checked``: the log has them)
    recomputed as :func:`~.sqlite_ops.row_crc` does, inline.

    :raises CorruptLogError: naming ``where`` and the first row whose checksum does not match.
    """
    crc = "crc" if checked else "NULL"  # a log written before checksums has no such column
    rows = conn.execute(
        f"SELECT {COLUMNS}, {crc} FROM events WHERE position > ? ORDER BY position LIMIT ?", (after, size)
    ).fetchall()
    if checked:
        pack, crc32 = _PACK, zlib.crc32
        for p, s, v, i, t, sv, r, c, co, d, crc in rows:
            body = d if type(d) is bytes else str(d).encode()
            if crc32(body, crc32(pack((p, s, v, i, t, sv, r, c, co)))) != crc:
                raise CorruptLogError(
                    where,
                    None,
                    f"event at position {p}: checksum mismatch: the row was changed after it was written (or its "
                    "checksum was); nothing was copied",
                )
    raw = _Raw
    return [Envelope(p, s, v, i, t, sv, r, c, co, raw(d)) for p, s, v, i, t, sv, r, c, co, d, _crc in rows]


def read_recorded(
    conn: sqlite3.Connection,
    stream: str | None,
    after: int,
    size: int,
    types: None = None,
    prefix: None = None,
) -> list[Recorded]:
    """:func:`read_rows` (unfiltered) as a fold reads it: no event ids, no causal links."""
    after = min(after, MAX_POSITION)
    if stream is not None:
        cursor = conn.execute(
            "SELECT position, version, type, schema_version, recorded_at, data FROM events"
            " WHERE stream = ? AND version > ? ORDER BY version LIMIT ?",
            (stream, after, size),
        )
        s = stream
        return [Recorded(p, s, v, t, sv, r, d) for p, v, t, sv, r, d in cursor.fetchall()]
    # the columns in the order of Recorded's fields, so that starmap builds each row's struct in C
    cursor = conn.execute(
        "SELECT position, stream, version, type, schema_version, recorded_at, data FROM events"
        " WHERE position > ? ORDER BY position LIMIT ?",
        (after, size),
    )
    return list(starmap(Recorded, cursor.fetchall()))


def read_stream_rows(
    conn: sqlite3.Connection, where: str, stream: str, after: int, size: int, until: int
) -> tuple[StreamRows | None]:
    """At most ``size`` events of ``stream`` after version ``after`` and at or before position ``until``, as a
    fold of that stream reads them, or None when there are none (in a tuple, never None itself, so that a
    caller can tell "no rows" from "not read").

    Three columns a row, and the last row's place in a second look-up: a Python object per column per row is
    what a replay's read costs (docs/performance.md). Two statements are two snapshots, which is safe here:
    the log only grows, and what grows lies after the rows already read.
    """
    after = min(after, MAX_POSITION)
    args = (stream, after, until)
    rows = conn.execute(
        "SELECT type, schema_version, data FROM events"
        " WHERE stream = ? AND version > ? AND position <= ? ORDER BY version LIMIT ?",
        (*args, size),
    ).fetchall()
    if not rows:
        return (None,)
    version, position, recorded_at = conn.execute(
        "SELECT version, position, recorded_at FROM events"
        " WHERE stream = ? AND version > ? AND position <= ? ORDER BY version LIMIT 1 OFFSET ?",
        (*args, len(rows) - 1),
    ).fetchone()
    check_contiguous(where, stream, after + 1, version, len(rows))
    return (StreamRows(after + 1, rows, position, recorded_at),)


def read_log_rows(
    conn: sqlite3.Connection, low: str, high: str, after: int, until: int
) -> tuple[list[LogRow], list[Recorded]]:
    """The events at positions after ``after`` and up to ``until``: those of the streams named between
    ``low`` and ``high`` (both excluded) as four-column rows, the others as :class:`Recorded` (a tuple, never
    None, as :meth:`SqliteStore._now` needs).

    Positions are gapless, so a range of them bounds the batch, and neither statement needs the other's last
    position. Both walk the same range of the table in position order; the second finds its pages cached.
    """
    args = (after, until, low, high)
    rows = conn.execute(
        "SELECT stream, type, schema_version, data FROM events"
        " WHERE position > ? AND position <= ? AND stream > ? AND stream < ? ORDER BY position",
        args,
    ).fetchall()
    recorded = conn.execute(
        "SELECT position, stream, version, type, schema_version, recorded_at, data FROM events"
        " WHERE position > ? AND position <= ? AND NOT (stream > ? AND stream < ?) ORDER BY position",
        args,
    ).fetchall()
    return rows, list(starmap(Recorded, recorded))


_LAST_PLACES: Final = """
WITH RECURSIVE s(stream) AS (
    SELECT min(stream) FROM events WHERE stream > :low AND stream < :high
    UNION ALL
    SELECT (SELECT min(stream) FROM events WHERE stream > s.stream AND stream < :high) FROM s
    WHERE s.stream IS NOT NULL
)
SELECT e.stream, e.version, e.position, e.recorded_at FROM (
    SELECT (SELECT position FROM events WHERE stream = s.stream AND position <= :until ORDER BY version DESC LIMIT 1)
    AS last FROM s WHERE s.stream IS NOT NULL
) AS x JOIN events AS e ON e.position = x.last
"""


def last_places(conn: sqlite3.Connection, low: str, high: str, until: int) -> dict[str, tuple[int, int, str]]:
    """Each stream named between ``low`` and ``high`` (excluded): its last event's version, position and time
    at or before position ``until``, for the streams that have one. One seek a stream (a skip-scan of the
    ``(stream, version)`` index, then its newest version back to the cut), not a step per event."""
    args = {"low": low, "high": high, "until": until}
    return {s: (v, p, r) for s, v, p, r in conn.execute(_LAST_PLACES, args)}


def head(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT coalesce(max(position), 0) FROM events").fetchone()[0])


_DISTINCT_STREAMS: Final = """
WITH RECURSIVE s(stream) AS (
    SELECT min(stream) FROM events
    UNION ALL
    SELECT (SELECT min(stream) FROM events WHERE stream > s.stream) FROM s WHERE s.stream IS NOT NULL
)
SELECT stream FROM s WHERE stream IS NOT NULL
"""


def streams(conn: sqlite3.Connection) -> list[str]:
    # a skip-scan of the (stream, version) index: one seek per stream, not one step per event
    return [row[0] for row in conn.execute(_DISTINCT_STREAMS)]
