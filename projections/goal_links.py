"""``goal_links``: which streams belong to which goal, and where each goal's events lie in the log.

``loopd-es history`` and ``explain`` need every stream of one goal: its own ``goal-<id>``, the switch sagas
that ran for it, the commands started for it or awaited by it. Finding them by scanning a million-event log
costs seconds; this read model answers with one indexed query. A stream is linked to a goal by its name
(``goal-<id>``) or by the first event on it whose payload names a top-level ``goal_id``; from then on every
event on that stream counts towards the goal, except on ``notifications``, the stream of every goal's notices,
where each counts for the goal it names. A stream may belong to several goals (a command awaited by two).

Tables (rows are a pure function of the log, so a rebuild is identical to the incremental model):

``goal_links``        (goal_id, stream) -> first_position (the linking event), last_position, events
``goal_links_goals``  goal_id -> first_position, last_position, events (over all of its linked streams)
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import msgspec

from loopd_es.events.notification import STREAM as NOTICES_STREAM

if TYPE_CHECKING:
    from loopd_es.events.envelope import Envelope

GOAL_PREFIX: Final = "goal-"

_LINK: Final = """
INSERT INTO goal_links (goal_id, stream, first_position, last_position, events) VALUES (?, ?, ?, ?, ?)
ON CONFLICT (goal_id, stream) DO UPDATE SET
    last_position = excluded.last_position, events = events + excluded.events
"""
_GOAL: Final = """
INSERT INTO goal_links_goals (goal_id, first_position, last_position, events) VALUES (?, ?, ?, ?)
ON CONFLICT (goal_id) DO UPDATE SET
    last_position = excluded.last_position, events = events + excluded.events
"""
_GOALS_OF: Final = "SELECT goal_id FROM goal_links WHERE stream = ?"


class _Ref(msgspec.Struct):
    """The one payload field this model reads; msgspec skips the rest without building it."""

    goal_id: str | None = None


_REF: Final = msgspec.json.Decoder(_Ref)


def linked_goal(envelope: Envelope) -> str | None:
    """The goal an event links its stream to: the id in a ``goal-<id>`` name, else a payload ``goal_id``."""
    stream = envelope.stream
    if stream.startswith(GOAL_PREFIX):
        return stream[len(GOAL_PREFIX) :] or None
    data = bytes(envelope.data)
    if b'"goal_id"' not in data:  # most command and saga events: no decode at all
        return None
    try:
        goal = _REF.decode(data).goal_id
    except msgspec.DecodeError:
        return None  # not a JSON object with a string goal_id: it links nothing
    return goal or None


class GoalLinks:
    """The goal <-> stream index behind ``loopd-es history`` (see the module docstring for the tables)."""

    name = "goal_links"
    version = 2  # 2: a notice counts for the goal it names only
    rebuild_cost = 1.0  # CPU s per 1M events of tools/bench_rebuild.py, alone: balances a parallel rebuild

    def schema(self, conn: sqlite3.Connection) -> None:
        conn.execute(
            """CREATE TABLE IF NOT EXISTS goal_links (
                goal_id TEXT NOT NULL, stream TEXT NOT NULL, first_position INTEGER NOT NULL,
                last_position INTEGER NOT NULL, events INTEGER NOT NULL, PRIMARY KEY (goal_id, stream)
            ) WITHOUT ROWID"""
        )
        conn.execute("CREATE INDEX IF NOT EXISTS goal_links_by_stream ON goal_links (stream, goal_id)")
        conn.execute(
            """CREATE TABLE IF NOT EXISTS goal_links_goals (
                goal_id TEXT PRIMARY KEY, first_position INTEGER NOT NULL, last_position INTEGER NOT NULL,
                events INTEGER NOT NULL
            ) WITHOUT ROWID"""
        )

    def apply(self, conn: sqlite3.Connection, envelope: Envelope) -> None:
        e = envelope
        goal = linked_goal(e)
        if goal is not None:
            conn.execute(
                "INSERT OR IGNORE INTO goal_links VALUES (?, ?, ?, ?, 0)",
                (goal, e.stream, e.position, e.position),
            )
        for (owner,) in conn.execute(_GOALS_OF, (e.stream,)).fetchall():
            if goal is not None and goal != owner and e.stream == NOTICES_STREAM:
                continue  # each notice is the goal's it names
            conn.execute(_LINK, (owner, e.stream, e.position, e.position, 1))
            conn.execute(_GOAL, (owner, e.position, e.position, 1))

    def apply_batch(self, conn: sqlite3.Connection, envelopes: Sequence[Envelope]) -> None:
        """Fold the batch in memory: one upsert per (goal, stream) and per goal instead of three per event."""
        owners: dict[str, list[str]] = {}  # stream -> its goals, read once per stream in this batch
        links: dict[tuple[str, str], list[int]] = {}  # (goal, stream) -> [first, last, events]
        goals: dict[str, list[int]] = {}
        for e in envelopes:
            stream, position = e.stream, e.position
            known = owners.get(stream)
            if known is None:
                known = owners[stream] = [row[0] for row in conn.execute(_GOALS_OF, (stream,))]
            goal = linked_goal(e) if not known or not stream.startswith(GOAL_PREFIX) else None
            if goal is not None and goal not in known:
                known.append(goal)
            for owner in known:
                if goal is not None and goal != owner and stream == NOTICES_STREAM:
                    continue  # each notice is the goal's it names
                link = links.get((owner, stream))
                if link is None:
                    links[(owner, stream)] = [position, position, 1]
                else:
                    link[1] = position
                    link[2] += 1
                span = goals.get(owner)
                if span is None:
                    goals[owner] = [position, position, 1]
                else:
                    span[1] = position
                    span[2] += 1
        conn.executemany(_LINK, [(g, s, v[0], v[1], v[2]) for (g, s), v in links.items()])
        conn.executemany(_GOAL, [(g, v[0], v[1], v[2]) for g, v in goals.items()])

    def reset(self, conn: sqlite3.Connection) -> None:
        conn.execute("DROP TABLE IF EXISTS goal_links")
        conn.execute("DROP TABLE IF EXISTS goal_links_goals")
