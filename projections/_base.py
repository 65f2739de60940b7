"""The bodies every batch-first read model repeats: run its DDL, apply one event as a batch of one, drop its tables."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from loopd_es.events.envelope import Envelope


class BatchModel:
    """A read model whose logic lives in ``apply_batch``: subclasses set ``DDL`` and ``TABLES`` and write that."""

    DDL: ClassVar[tuple[str, ...]] = ()
    """``CREATE TABLE/INDEX IF NOT EXISTS`` statements, run in order by :meth:`schema`."""
    TABLES: ClassVar[tuple[str, ...]] = ()
    """The tables :meth:`reset` drops (their indexes go with them)."""

    def schema(self, conn: sqlite3.Connection) -> None:
        for ddl in self.DDL:
            conn.execute(ddl)

    def apply(self, conn: sqlite3.Connection, envelope: Envelope) -> None:
        self.apply_batch(conn, (envelope,))

    def apply_batch(self, conn: sqlite3.Connection, envelopes: Sequence[Envelope]) -> None:
        raise NotImplementedError

    def reset(self, conn: sqlite3.Connection) -> None:
        for table in self.TABLES:
            conn.execute(f"DROP TABLE IF EXISTS {table}")
