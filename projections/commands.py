"""``commands``: one row per command session: status, end reason, exit code, watch state and linked goal.

Rows come from the command domain's own fold (:func:`loopd_es.domain.command.evolve`, state kept in
``commands_fold``), so a second exit or a stray event changes nothing here either. A removed command keeps
its row (``removed = 1``): its stream stays as history.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from functools import cache
from typing import TYPE_CHECKING, Any, Final

import msgspec

from loopd_es.clock import stamp, stamp_or_none
from loopd_es.domain.streams import COMMAND_PREFIX

from ._base import BatchModel
from ._fold import by_stream, payload, when
from .goals import caller_json

if TYPE_CHECKING:
    from loopd_es.domain.command import CommandState
    from loopd_es.events.envelope import Envelope

COLUMNS: Final = (
    "command_id", "title", "command_line", "cwd", "goal_id", "status", "end_reason", "exit_code", "signal",
    "last_error", "claim", "timeout_seconds", "watch_filter", "watch_until", "watch_state", "watch_pushes",
    "watch_matches", "awaits", "pid", "output_bytes", "truncated", "removed", "started_at", "ended_at",
    "updated_at", "version", "position", "started_by", "controlled_by",
)  # fmt: skip
_DDL: Final = (
    """CREATE TABLE IF NOT EXISTS commands (
        command_id TEXT PRIMARY KEY, title TEXT NOT NULL, command_line TEXT NOT NULL, cwd TEXT NOT NULL,
        goal_id TEXT, status TEXT NOT NULL, end_reason TEXT, exit_code INTEGER, signal TEXT, last_error TEXT,
        claim TEXT, timeout_seconds INTEGER, watch_filter TEXT, watch_until TEXT, watch_state TEXT NOT NULL,
        watch_pushes INTEGER NOT NULL, watch_matches INTEGER NOT NULL, awaits INTEGER NOT NULL, pid INTEGER,
        output_bytes INTEGER NOT NULL, truncated INTEGER NOT NULL, removed INTEGER NOT NULL,
        started_at TEXT NOT NULL, ended_at TEXT, updated_at TEXT NOT NULL, version INTEGER NOT NULL,
        position INTEGER NOT NULL, started_by TEXT, controlled_by TEXT
    ) WITHOUT ROWID""",
    "CREATE TABLE IF NOT EXISTS commands_fold (command_id TEXT PRIMARY KEY, state BLOB NOT NULL) WITHOUT ROWID",
)
_UPSERT: Final = (
    f"INSERT OR REPLACE INTO commands ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"
)
_ENCODER: Final = msgspec.msgpack.Encoder()


@cache
def _decoder() -> msgspec.msgpack.Decoder[CommandState]:
    """The fold's state decoder, built (and the command domain imported) at the first batch to fold: a
    query whose read models are caught up never folds."""
    from loopd_es.domain.command import CommandState

    return msgspec.msgpack.Decoder(CommandState)


def command_row(s: CommandState, updated_at: str, position: int) -> tuple[Any, ...]:
    from loopd_es.domain.command import argv_text

    """The ``commands`` row of a folded command, in :data:`COLUMNS` order."""
    watch = s.watch
    return (
        s.id, s.title, argv_text(s), s.cwd, s.goal_id, s.status, s.end_reason, s.exit_code, s.signal,
        s.last_error, s.claim, s.timeout_seconds, watch.filter or None if watch else None,
        watch.until or None if watch else None, s.watch_state if watch is not None else "none",
        s.watch_pushes, s.watch_matches, len(s.awaits), s.pid, s.output_bytes, int(s.truncated),
        int(s.removed), stamp(s.created_at), stamp_or_none(s.ended_at), updated_at, s.version, position,
        caller_json(s.started_by), caller_json(s.controlled_by),
    )  # fmt: skip


class Commands(BatchModel):
    """Rows of ``commands`` (see :data:`COLUMNS`), folded from ``command-<id>`` streams."""

    name = "commands"
    version = 2  # 2: started_by, controlled_by (the tool calls, as JSON)
    rebuild_cost = 0.3  # CPU s per 1M events of tools/bench_rebuild.py, alone: balances a parallel rebuild
    DDL = _DDL
    TABLES = ("commands", "commands_fold")

    def apply_batch(self, conn: sqlite3.Connection, envelopes: Sequence[Envelope]) -> None:
        """One load and one write per command of the batch (the writes in one executemany each)."""
        from loopd_es.domain.command import evolve

        decoder = _decoder()
        folds: list[tuple[str, bytes]] = []
        rows: list[tuple[Any, ...]] = []
        for command_id, group in by_stream(envelopes, COMMAND_PREFIX).items():
            row = conn.execute(
                "SELECT state FROM commands_fold WHERE command_id = ?", (command_id,)
            ).fetchone()
            state: CommandState | None = None if row is None else decoder.decode(row[0])
            for env in group:
                state = evolve(state, payload(env), env.version)
            if state is None:
                continue  # no command.started yet: nothing to show
            folds.append((command_id, _ENCODER.encode(state)))
            rows.append(command_row(state, when("", group[-1]), group[-1].position))
        conn.executemany("INSERT OR REPLACE INTO commands_fold (command_id, state) VALUES (?, ?)", folds)
        conn.executemany(_UPSERT, rows)
