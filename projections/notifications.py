"""``notifications``: every owner notice the engine recorded, and whether the host delivered it.

One row per ``notification_id`` (``<cause event id>:<kind>``): opened by ``notification.requested`` (a second
request of the same id changes nothing, as in the log, where it appends nothing), stamped by
``notification.delivered``, or settled by ``notification.undeliverable`` (no session of the host to show it in:
a goal created from the CLI; the row is where its owner reads it).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from loopd_es.events import notification as n

from ._fold import payload, when

if TYPE_CHECKING:
    from loopd_es.events.envelope import Envelope

_DDL: Final = (
    """CREATE TABLE IF NOT EXISTS notifications (
        notification_id TEXT PRIMARY KEY, position INTEGER NOT NULL, goal_id TEXT NOT NULL,
        owner_session_id TEXT NOT NULL, kind TEXT NOT NULL, text TEXT NOT NULL, cause_event_id TEXT NOT NULL,
        requested_at TEXT NOT NULL, delivered_at TEXT, delivered_position INTEGER, undeliverable TEXT
    )""",
    "CREATE INDEX IF NOT EXISTS notifications_by_goal ON notifications (goal_id, position)",
)
_TYPES: Final = frozenset(
    (
        n.NotificationRequested.event_type,
        n.NotificationDelivered.event_type,
        n.NotificationUndeliverable.event_type,
    )
)


class Notifications:
    """Rows of ``notifications``: id -> goal, owner, kind, text, cause, requested and delivered times, and why
    it could not be delivered (``undeliverable``)."""

    name = "notifications"
    version = 2

    def schema(self, conn: sqlite3.Connection) -> None:
        for ddl in _DDL:
            conn.execute(ddl)

    def apply_batch(self, conn: sqlite3.Connection, envelopes: Sequence[Envelope]) -> None:
        for env in envelopes:
            self.apply(conn, env)

    def apply(self, conn: sqlite3.Connection, envelope: Envelope) -> None:
        if envelope.type not in _TYPES:
            return
        e = payload(envelope)
        if isinstance(e, n.NotificationRequested):
            conn.execute(
                "INSERT OR IGNORE INTO notifications (notification_id, position, goal_id, owner_session_id, kind, "
                "text, cause_event_id, requested_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    e.notification_id,
                    envelope.position,
                    e.goal_id,
                    e.owner_session_id,
                    e.kind,
                    e.text,
                    e.cause_event_id,
                    when(e.at, envelope),
                ),
            )
        elif isinstance(e, n.NotificationDelivered):
            conn.execute(
                "UPDATE notifications SET delivered_at = ?, delivered_position = ? "
                "WHERE notification_id = ? AND delivered_at IS NULL",
                (when(e.at, envelope), envelope.position, e.notification_id),
            )
        elif isinstance(e, n.NotificationUndeliverable):
            conn.execute(
                "UPDATE notifications SET undeliverable = ? WHERE notification_id = ? AND delivered_at IS NULL",
                (e.reason, e.notification_id),
            )

    def reset(self, conn: sqlite3.Connection) -> None:
        conn.execute("DROP TABLE IF EXISTS notifications")
