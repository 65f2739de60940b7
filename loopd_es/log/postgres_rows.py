"""The PostgreSQL backend's read of one stream as its fold reads it (:class:`~loopd_es.events.envelope.StreamRows`).

Three columns a row and the last row's place in a second statement, as on SQLite: a replay pays for a Python
object per column per row. The two statements may see two snapshots, which is safe: the log only grows, and
a stream grows after the rows already read, so the row at the offset is the last of those.
"""

from __future__ import annotations

from typing import Any, Final

from psycopg import sql

from ..events.envelope import StreamRows
from .invariants import check_contiguous

_WHERE: Final = " FROM {} WHERE stream = %s AND version > %s AND position <= %s ORDER BY version"
ROWS: Final = sql.SQL("SELECT type, schema_version, data" + _WHERE + " LIMIT %s")
PLACE: Final = sql.SQL("SELECT version, position, recorded_at" + _WHERE + " LIMIT 1 OFFSET %s")


async def read_stream_rows(
    conn: Any, statements: tuple[Any, Any], where: str, stream: str, after: int, size: int, until: int
) -> StreamRows | None:
    """At most ``size`` events of ``stream`` after version ``after``, at or before position ``until``; None when
    there are none. ``statements`` are :data:`ROWS` and :data:`PLACE` formatted with the events table."""
    rows_sql, place_sql = statements
    args = (stream, after, until)
    rows = await (await conn.execute(rows_sql, (*args, size), binary=True)).fetchall()
    if not rows:
        return None
    version, position, recorded_at = await (
        await conn.execute(place_sql, (*args, len(rows) - 1), binary=True)
    ).fetchone()
    check_contiguous(where, stream, after + 1, version, len(rows))
    return StreamRows(after + 1, rows, position, recorded_at)
