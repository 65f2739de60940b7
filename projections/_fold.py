"""Helpers the read models share: grouping a batch by stream, and keeping a goal's folded state in a table.

The goal read models reuse the domain's own fold (:class:`~loopd_es.domain.evolve.GoalFold`) instead of
re-implementing its rules, so a row never disagrees with ``loopd-es replay``. The folded state lives in a
table of the projection that folds it (never shared: each projection is rebuilt alone), encoded as msgpack,
and is loaded once and saved once per stream per batch.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Final

import msgspec

from loopd_es.domain.evolve import initial
from loopd_es.domain.state import GoalState
from loopd_es.domain.streams import GOAL_PREFIX

if TYPE_CHECKING:
    from loopd_es.events.envelope import Envelope

_ENCODER: Final = msgspec.msgpack.Encoder()
_DECODER: Final = msgspec.msgpack.Decoder(GoalState)


def by_stream(envelopes: Iterable[Envelope], prefix: str) -> dict[str, list[Envelope]]:
    """The envelopes of streams named ``<prefix><id>``, grouped by id, each group in log order.

    Streams are independent, so folding each group in one go gives the rows event-by-event folding would.
    """
    groups: dict[str, list[Envelope]] = {}
    cut = len(prefix)
    for env in envelopes:
        if env.stream.startswith(prefix) and len(env.stream) > cut:
            groups.setdefault(env.stream[cut:], []).append(env)
    return groups


def goal_groups(envelopes: Iterable[Envelope]) -> dict[str, list[Envelope]]:
    """:func:`by_stream` for goal streams."""
    return by_stream(envelopes, GOAL_PREFIX)


def when(at: str, env: Envelope) -> str:
    """The time a payload says it happened, else when the log recorded it (payload times may be empty)."""
    return at or env.recorded_at


class GoalFolds:
    """Each goal's folded :class:`GoalState`, kept in ``table`` (goal_id -> msgpack state)."""

    def __init__(self, table: str) -> None:
        self.table = table

    def schema(self, conn: sqlite3.Connection) -> None:
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {self.table} (goal_id TEXT PRIMARY KEY, state BLOB NOT NULL) WITHOUT ROWID"
        )

    def reset(self, conn: sqlite3.Connection) -> None:
        conn.execute(f"DROP TABLE IF EXISTS {self.table}")

    def load(self, conn: sqlite3.Connection, goal_id: str) -> GoalState:
        row = conn.execute(f"SELECT state FROM {self.table} WHERE goal_id = ?", (goal_id,)).fetchone()
        return initial(goal_id) if row is None else _DECODER.decode(row[0])

    def save(self, conn: sqlite3.Connection, state: GoalState) -> None:
        conn.execute(
            f"INSERT OR REPLACE INTO {self.table} (goal_id, state) VALUES (?, ?)",
            (state.goal_id, _ENCODER.encode(state)),
        )


def json_list(items: Sequence[str]) -> str:
    """A list stored in one column, as JSON text."""
    return msgspec.json.encode(list(items)).decode()
