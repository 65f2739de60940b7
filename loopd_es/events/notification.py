"""Owner notifications, on stream ``notifications``: an outbox the engine delivers through the host.

``notification.requested`` is keyed by its cause: its ``notification_id`` is ``<cause event id>:<kind>`` and its
event id is derived from that, so recording the same notice twice (a retry, a restart) appends nothing.
``notification.delivered`` follows once the host showed it; the host ignores a notification id it has shown
already, so a crash between showing and recording cannot show it twice. ``notification.undeliverable`` settles
a notice whose owner is no session of the host (a goal created from the CLI, whose owner is ``cli``; a session
deleted since): it is not retried, and it stays readable in ``loopd-es notifications``.
"""

from __future__ import annotations

from typing import Final, Literal

from .base import Event, event
from .times import UtcTime
from .upcasting import register_upcaster, times_to_utc

STREAM: Final = "notifications"
"""The one stream of every goal's and command's notices: an event there belongs to the goal it names only."""

NotificationKind = Literal[
    "complete", "blocked", "failed", "stopped", "unreachable", "stuck", "await", "command", "watch"
]
"""``command``: a command's exit told to the session that started it; ``watch``: a watch push or notice."""


@event("notification.requested", version=2)
class NotificationRequested(Event, frozen=True):
    """The owner of ``goal_id`` (or of command ``command_id``) must be told ``text``, because of ``cause_event_id``.

    A command's notice names no goal (``goal_id`` is ``""``): it belongs to the command, whose goal link is
    for display only."""

    notification_id: str
    goal_id: str
    owner_session_id: str
    kind: NotificationKind
    text: str
    cause_event_id: str
    at: UtcTime | None = None
    command_id: str = ""


@event("notification.delivered", version=2)
class NotificationDelivered(Event, frozen=True):
    """The host showed the notice ``notification_id`` to its owner."""

    notification_id: str
    goal_id: str
    at: UtcTime | None = None
    command_id: str = ""


@event("notification.undeliverable", version=1)
class NotificationUndeliverable(Event, frozen=True):
    """The notice ``notification_id`` has no host session to be shown in; settled, read with ``notifications``.

    ``reason`` says why (the owner ``cli`` of a goal created from the CLI is no OpenCode session); the notice is
    not asked of the host again."""

    notification_id: str
    goal_id: str
    reason: str
    at: UtcTime | None = None
    command_id: str = ""


register_upcaster("notification.requested", 1, times_to_utc("at"))
register_upcaster("notification.delivered", 1, times_to_utc("at"))
