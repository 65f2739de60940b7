"""Owner notifications, on stream ``notifications``: an outbox the engine delivers through the host.

``notification.requested`` is keyed by its cause: its ``notification_id`` is ``<cause event id>:<kind>`` and its
event id is derived from that, so recording the same notice twice (a retry, a restart) appends nothing.
``notification.delivered`` follows once the host showed it; the host ignores a notification id it has shown
already, so a crash between showing and recording cannot show it twice.
"""

from __future__ import annotations

from typing import Literal

from .base import Event, event

NotificationKind = Literal["complete", "blocked", "failed", "stopped", "unreachable", "stuck", "await"]


@event("notification.requested")
class NotificationRequested(Event, frozen=True):
    """The owner of ``goal_id`` must be told ``text``, because of event ``cause_event_id``."""

    notification_id: str
    goal_id: str
    owner_session_id: str
    kind: NotificationKind
    text: str
    cause_event_id: str
    at: str = ""


@event("notification.delivered")
class NotificationDelivered(Event, frozen=True):
    """The host showed the notice ``notification_id`` to its owner."""

    notification_id: str
    goal_id: str
    at: str = ""
