"""``awaits``: every time a goal waited on a command, and how the wait ended.

One row per await, keyed by the position of the event that opened it: ``waiting`` from
``command.await-requested`` until it is ``fired`` (with the evidence), ``discarded`` (its goal is gone) or
``cancelled`` (goal paused or cleared, command removed). An await that fired at once, because its condition
already held, has no request: its row opens and closes on the ``command.await-fired`` (``immediate = 1``).
As in the command fold, a second request while one is waiting for the same goal and command changes nothing.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from loopd_es.domain.streams import COMMAND_PREFIX
from loopd_es.events import command as c

from ._fold import json_list, payload, when

if TYPE_CHECKING:
    from loopd_es.events.envelope import Envelope

_DDL: Final = (
    """CREATE TABLE IF NOT EXISTS awaits (
        await_id INTEGER PRIMARY KEY, command_id TEXT NOT NULL, goal_id TEXT NOT NULL, until TEXT,
        ignore_case INTEGER NOT NULL, status TEXT NOT NULL, immediate INTEGER NOT NULL, command_status TEXT,
        exit_code INTEGER, signal TEXT, matched_lines TEXT, evidence TEXT, reason TEXT,
        requested_at TEXT NOT NULL, ended_at TEXT, ended_position INTEGER, owner_session_id TEXT
    )""",
    "CREATE INDEX IF NOT EXISTS awaits_by_goal ON awaits (goal_id, await_id)",
    "CREATE INDEX IF NOT EXISTS awaits_waiting ON awaits (command_id, goal_id) WHERE status = 'waiting'",
)
_TYPES: Final = frozenset(
    e.event_type
    for e in (c.AwaitRequested, c.AwaitFired, c.AwaitDiscarded, c.AwaitCancelled, c.CommandRemoved)
)
_CLOSE: Final = (
    "UPDATE awaits SET status = ?, reason = ?, ended_at = ?, ended_position = ? "
    "WHERE command_id = ? AND status = 'waiting'"
)


class Awaits:
    """Rows of ``awaits``: await_id -> command, goal, until pattern, status, evidence, times."""

    name = "awaits"
    version = 2  # 2: owner_session_id; requested_at is the request's own time when it has one
    rebuild_cost = 0.2  # CPU s per 1M events of tools/bench_rebuild.py, alone: balances a parallel rebuild

    def schema(self, conn: sqlite3.Connection) -> None:
        for ddl in _DDL:
            conn.execute(ddl)

    def apply_batch(self, conn: sqlite3.Connection, envelopes: Sequence[Envelope]) -> None:
        types = _TYPES  # most events are not awaits: one set lookup each, not a call
        for env in envelopes:
            if env.type in types:
                self.apply(conn, env)

    def apply(self, conn: sqlite3.Connection, envelope: Envelope) -> None:
        if envelope.type not in _TYPES or not envelope.stream.startswith(COMMAND_PREFIX):
            return
        env, e = envelope, payload(envelope)
        at = when("", env)  # an imported event's source time
        if isinstance(e, c.CommandRemoved):  # the fold drops what is left; removal cancels it first
            conn.execute(_CLOSE, ("cancelled", "command removed", at, env.position, e.command_id))
            return
        assert isinstance(e, c.AwaitRequested | c.AwaitFired | c.AwaitDiscarded | c.AwaitCancelled)
        waiting = conn.execute(
            "SELECT await_id FROM awaits WHERE command_id = ? AND goal_id = ? AND status = 'waiting'",
            (e.command_id, e.goal_id),
        ).fetchone()
        if isinstance(e, c.AwaitRequested):
            if waiting is None:
                conn.execute(
                    "INSERT INTO awaits (await_id, command_id, goal_id, until, ignore_case, status, immediate, "
                    "requested_at, owner_session_id) VALUES (?, ?, ?, ?, ?, 'waiting', 0, ?, ?)",
                    (
                        env.position,
                        e.command_id,
                        e.goal_id,
                        e.until,
                        int(e.ignore_case),
                        when(e.at, env),
                        e.owner_session_id,
                    ),  # fmt: skip
                )
            return
        if isinstance(e, c.AwaitFired):
            await_id = waiting[0] if waiting is not None else env.position
            if waiting is None:
                conn.execute(
                    "INSERT INTO awaits (await_id, command_id, goal_id, until, ignore_case, status, immediate, "
                    "requested_at) VALUES (?, ?, ?, ?, 0, 'waiting', 1, ?)",
                    (await_id, e.command_id, e.goal_id, e.until, at),
                )
            conn.execute(
                "UPDATE awaits SET status = 'fired', immediate = max(immediate, ?), command_status = ?, "
                "exit_code = ?, signal = ?, matched_lines = ?, evidence = ?, ended_at = ?, ended_position = ? "
                "WHERE await_id = ?",
                (int(e.immediate), e.status, e.exit_code, e.signal, json_list(e.matched_lines), e.evidence,
                 at, env.position, await_id),
            )  # fmt: skip
        elif waiting is not None:
            status = "discarded" if isinstance(e, c.AwaitDiscarded) else "cancelled"
            conn.execute(
                "UPDATE awaits SET status = ?, reason = ?, ended_at = ?, ended_position = ? WHERE await_id = ?",
                (status, e.reason, at, env.position, waiting[0]),
            )

    def reset(self, conn: sqlite3.Connection) -> None:
        conn.execute("DROP TABLE IF EXISTS awaits")
