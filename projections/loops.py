"""``loops``: every ``/loop`` task with its next due time, last fire, missed slots and owner; ``loop_fires``: every slot
attempt with the next due time it chose (and why: jitter offset, random fallback draw).

Rows are folded with the scheduler's own fold (:func:`loopd_es.domain.loop.model.evolve`), so the read model never
disagrees with what a scheduler decides on: the task's whole folded state is kept (msgpack) next to the
columns queries filter on, loaded and saved once per session stream per batch. Times in the columns are epoch
milliseconds (what ``loops --json`` has always shown, and what SQLite orders and indexes as numbers); the
events and the folded state hold them as UTC datetimes.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from functools import cache
from typing import TYPE_CHECKING, Any, Final

import msgspec

from loopd_es.clock import to_ms
from loopd_es.events import loop as ev

if TYPE_CHECKING:
    from datetime import datetime
    from types import ModuleType

    from loopd_es.domain.loop.model import Task
    from loopd_es.events.envelope import Envelope

_DDL: Final = (
    """CREATE TABLE IF NOT EXISTS loops (
        task_id TEXT PRIMARY KEY, session_id TEXT NOT NULL, mode TEXT NOT NULL, status TEXT NOT NULL,
        next_due_at INTEGER, last_fired_at INTEGER, fires INTEGER NOT NULL, failures INTEGER NOT NULL,
        missed INTEGER NOT NULL, owner TEXT, durable INTEGER NOT NULL, in_flight_slot INTEGER,
        prompt TEXT NOT NULL, state BLOB NOT NULL, position INTEGER NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS loops_by_session ON loops (session_id, task_id)",
    "CREATE INDEX IF NOT EXISTS loops_by_due ON loops (next_due_at) WHERE status = 'active'",
    """CREATE TABLE IF NOT EXISTS loop_fires (
        task_id TEXT NOT NULL, slot INTEGER NOT NULL, attempt INTEGER NOT NULL, due_at INTEGER,
        claimed_at INTEGER, fired_by TEXT, outcome TEXT NOT NULL, reason TEXT, ended_at INTEGER,
        next_due_at INTEGER, jitter_offset_ms INTEGER, fallback_u REAL,
        PRIMARY KEY (task_id, slot, attempt)
    )""",
    """CREATE TABLE IF NOT EXISTS loop_missed (
        task_id TEXT NOT NULL, first_slot INTEGER NOT NULL, last_slot INTEGER NOT NULL, n INTEGER NOT NULL,
        at INTEGER NOT NULL, PRIMARY KEY (task_id, first_slot)
    )""",
)
_ENC: Final = msgspec.msgpack.Encoder()


@cache
def _fold() -> tuple[ModuleType, msgspec.msgpack.Decoder[Task], Callable[[Envelope], Any]]:
    """The scheduler's fold, its state decoder and the catalogue's decoder, imported at the first event to
    fold: a query whose read models are caught up never folds."""
    from loopd_es.domain.loop import model
    from loopd_es.events.catalogue import decode_payload

    return model, msgspec.msgpack.Decoder(model.Task), decode_payload


def _ms(at: datetime | None) -> int | None:
    return None if at is None else to_ms(at)


def _status(t: Task) -> str:
    return f"cancelled:{t.cancelled}" if t.cancelled else ("paused" if t.paused else "active")


class Loops:
    """Rows of ``loops`` (one per task), ``loop_fires`` (one per slot attempt) and ``loop_missed``."""

    name = "loops"
    version = 3
    """2: the folded state keeps its times as datetimes (a rebuild re-folds the msgpack state of version 1).
    3: a started fire is ``firing`` (no claimer or expiry: those are coordination records now); ``loop_fires``
    names the scheduler in ``fired_by``."""

    def schema(self, conn: sqlite3.Connection) -> None:
        for ddl in _DDL:
            conn.execute(ddl)

    def apply_batch(self, conn: sqlite3.Connection, envelopes: Sequence[Envelope]) -> None:
        for env in envelopes:
            self.apply(conn, env)

    def apply(self, conn: sqlite3.Connection, envelope: Envelope) -> None:
        if not envelope.stream.startswith(ev.SESSION_PREFIX) or not envelope.type.startswith("loop."):
            return
        model, decoder, decode_payload = _fold()
        e = decode_payload(envelope)
        tid = getattr(e, "task_id", None)
        if tid is None:
            return
        s = model.SessionLoops(session_id=envelope.stream[len(ev.SESSION_PREFIX) :])
        row = conn.execute("SELECT state FROM loops WHERE task_id = ?", (tid,)).fetchone()
        if row is not None:
            s.tasks[tid] = decoder.decode(row[0])
        model.evolve(s, e)
        t = s.tasks.get(tid)
        if t is None:
            return
        conn.execute(
            "INSERT OR REPLACE INTO loops VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (t.task_id, t.session_id, t.mode, _status(t), _ms(t.due_at()), _ms(t.last_fired_at), t.fires, t.failures,
             t.missed, t.owner, int(t.durable), t.firing.slot if t.firing else None, t.prompt, _ENC.encode(t),
             envelope.position),
        )  # fmt: skip
        if isinstance(e, ev.SlotClaimed):
            conn.execute(
                "INSERT OR REPLACE INTO loop_fires VALUES (?, ?, ?, ?, ?, ?, 'in-flight', NULL, NULL, ?, ?, ?)",
                (
                    tid,
                    e.slot,
                    e.attempt,
                    to_ms(e.due_at),
                    to_ms(e.claimed_at),
                    e.by,
                    _ms(e.next_due_at),
                    e.jitter_offset_ms,
                    e.fallback_u,
                ),
            )
        elif isinstance(e, ev.FireSucceeded | ev.FireFailed):
            ok = isinstance(e, ev.FireSucceeded)
            conn.execute(
                "UPDATE loop_fires SET outcome = ?, reason = ?, ended_at = ? WHERE task_id = ? AND slot = ? "
                "AND attempt = ?",
                ("succeeded" if ok else "failed", None if ok else getattr(e, "reason", None), to_ms(e.at), tid, e.slot,
                 e.attempt),
            )  # fmt: skip
        elif isinstance(e, ev.SlotsMissed):
            conn.execute(
                "INSERT OR REPLACE INTO loop_missed VALUES (?, ?, ?, ?, ?)",
                (tid, e.first_slot, e.last_slot, e.n, to_ms(e.at)),
            )

    def reset(self, conn: sqlite3.Connection) -> None:
        for table in ("loops", "loop_fires", "loop_missed"):
            conn.execute(f"DROP TABLE IF EXISTS {table}")
