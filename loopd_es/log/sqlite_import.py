"""Copying a whole log into an empty SQLite log (``import --from``): the envelopes go in verbatim, positions,
ids and times as recorded, in one transaction. Kept apart from :mod:`.sqlite_ops` (the append and read path)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import UsageError
from .sqlite_ops import INSERT, row_crc

if TYPE_CHECKING:
    import sqlite3

    from ..events.envelope import Envelope


def begin_import(conn: sqlite3.Connection, url: str) -> None:
    conn.execute("BEGIN IMMEDIATE")
    count = conn.execute("SELECT count(*) FROM events").fetchone()[0]
    if count:
        conn.execute("ROLLBACK")
        raise UsageError(f"{url} is not empty ({count} events); import only into a new log")


def insert_verbatim(conn: sqlite3.Connection, batch: list[Envelope]) -> None:
    conn.executemany(
        INSERT,
        [
            (*row, row_crc(*row))
            for row in (
                (
                    e.position,
                    e.stream,
                    e.version,
                    e.event_id,
                    e.type,
                    e.schema_version,
                    e.recorded_at,
                    e.causation_id,
                    e.correlation_id,
                    bytes(e.data),
                )
                for e in batch
            )
        ],
    )


def finish_import(conn: sqlite3.Connection) -> None:
    conn.execute("COMMIT")
