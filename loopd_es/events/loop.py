"""Scheduled-loop events: ``/loop`` tasks, their slots, session facts, owner leases and goal-schedule slots.

Streams (one aggregate each, so every check that must be atomic is one version-checked append):

- ``loop-session-<session id>``: every task of that session and every fire of those tasks. A slot is taken
  (``loop.slot_claimed``) by an append at the stream's expected version, so a concurrent pause, cancel or a
  second scheduler moves the version and loses: a slot fires once. Who is firing it *right now*, and until
  when, is not history: it is a coordination record beside the log (:mod:`loopd_es.sched.fires`), which also
  keeps one injection per session at a time; the fire's events are fenced on it.
- ``loop-active``: which session the user is in (``loop.session_activated``) and child→parent links.
- ``loop-lease-<owner>``: an owner's lease; an ephemeral task dies when its owner's lease expires.
- ``loop-goal-<goal id>``: the slots of a goal schedule (docs/reference/loopd.md#s3-15), taken the same way.
- ``loop-cap``: logs of earlier versions hold one ``loop.task_counted`` per creation there (the 50-task cap's
  fence, kept as events). The cap is a coordination record beside the log now (``loops/task-cap``,
  :func:`loopd_es.sched.service.create_task`): ``loop.task_counted`` is no event type any more, nothing decodes
  that stream, and nothing can append one again.

Instants are :data:`~.times.UtcTime` (RFC 3339 UTC text in the log); durations stay milliseconds
(``interval_ms``, ``jitter_offset_ms``, ``min_ms``, ...), the reference's unit. Before version 2 the instants
were epoch milliseconds too: :data:`EPOCH_MS_FIELDS` names them, and an upcaster reads such an event as the same
instants. Every decision a replay would otherwise recompute - the chosen next due time, the jitter offset, the
random fallback draw, the clamp inputs - is in the event.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from .base import Event, event
from .times import UtcTime
from .upcasting import epoch_ms_to_text, register_upcaster

Mode = Literal["fixed", "adaptive", "maintenance"]
CancelReason = Literal["user", "once-complete", "session-deleted", "expired", "owner-dead"]
Source = Literal["user", "default"]
Via = Literal["slash", "tool"]

SESSION_PREFIX: Final = "loop-session-"
ACTIVE_STREAM: Final = "loop-active"
LEASE_PREFIX: Final = "loop-lease-"
"""Streams where /loop owners' leases were events before 0.4 (coordination records now): read, never decoded."""
GOAL_PREFIX: Final = "loop-goal-"
CAP_STREAM: Final = "loop-cap"


def session_stream(session_id: str) -> str:
    """The stream holding every task and fire of one session."""
    return f"{SESSION_PREFIX}{session_id}"


def goal_slot_stream(goal_id: str) -> str:
    """The stream holding the schedule slots of one goal."""
    return f"{GOAL_PREFIX}{goal_id}"


@event("loop.task_created", version=2)
class TaskCreated(Event, frozen=True, kw_only=True):
    """A ``/loop`` task was scheduled; ``origin_id`` (the message it came from) makes creation idempotent."""

    task_id: str
    origin_id: str
    session_id: str
    prompt: str
    mode: Mode
    interval_ms: int | None = None
    jitter: bool | None = None
    once: bool = False
    adaptive_min_ms: int | None = None
    adaptive_max_ms: int | None = None
    source: Source = "user"
    via: Via = "slash"
    directory: str = ""
    loop_file_path: str | None = None
    content_hash: str | None = None
    owner: str | None = None
    durable: bool = False
    created_at: UtcTime
    ran_on_creation: bool = False
    next_due_at: UtcTime
    jitter_offset_ms: int = 0
    fallback_u: float | None = None


@event("loop.task_paused", version=2)
class TaskPaused(Event, frozen=True, kw_only=True):
    """The task stops being due until resumed."""

    task_id: str
    at: UtcTime
    by: str = "user"


@event("loop.task_resumed", version=2)
class TaskResumed(Event, frozen=True, kw_only=True):
    """The task was re-armed from ``at`` (no catch-up fire after a pause)."""

    task_id: str
    at: UtcTime
    by: str = "user"
    next_due_at: UtcTime
    jitter_offset_ms: int = 0
    fallback_u: float | None = None


@event("loop.task_rescheduled", version=2)
class TaskRescheduled(Event, frozen=True, kw_only=True):
    """The next due time was moved; ``requested_*`` and the bounds are the clamp's inputs."""

    task_id: str
    at: UtcTime
    by: str = "model"
    requested_delay_ms: float | None = None
    requested_next_due_at: UtcTime | None = None
    """The time the model asked for, held within years 1-9999 (see :func:`loopd_es.clock.from_ms_held`)."""
    min_ms: int | None = None
    max_ms: int | None = None
    fallback_u: float | None = None
    next_due_at: UtcTime


@event("loop.task_converted_to_fixed", version=2)
class TaskConvertedToFixed(Event, frozen=True, kw_only=True):
    """An adaptive task became fixed (``set_fixed``); its grid is anchored at ``at``."""

    task_id: str
    at: UtcTime
    by: str = "model"
    interval_ms: int
    jitter: bool
    jitter_offset_ms: int = 0
    next_due_at: UtcTime


@event("loop.task_cancelled", version=2)
class TaskCancelled(Event, frozen=True, kw_only=True):
    """The task ended for good; nothing after this can bring it back."""

    task_id: str
    reason: CancelReason
    at: UtcTime
    by: str = "user"


@event("loop.task_adopted", version=2)
class TaskAdopted(Event, frozen=True, kw_only=True):
    """A durable task whose owner's lease expired now belongs to ``owner``."""

    task_id: str
    owner: str
    previous_owner: str | None = None
    at: UtcTime


@event("loop.slot_claimed", version=3)
class SlotClaimed(Event, frozen=True, kw_only=True):
    """``slot`` of the task was taken for firing; the next slot's due time is decided here, before the fire.

    The append that records it met the stream's expected version, so a slot is taken once. ``slot`` is the
    key of the occurrence: a retry (one-shot failure, a scheduler lost mid-fire) takes the same slot with
    ``attempt + 1``. ``prompt`` is set when a file-backed maintenance task's ``loop.md`` changed (the new text
    and ``content_hash`` become the task's). ``by`` names the scheduler that fired it; how long it may take is
    not recorded here (that is its coordination record's business, renewed while it fires).
    """

    task_id: str
    slot: int
    attempt: int = 1
    due_at: UtcTime
    claimed_at: UtcTime
    by: str = "scheduler"
    next_due_at: UtcTime | None = None
    jitter_offset_ms: int = 0
    fallback_u: float | None = None
    content_hash: str | None = None
    prompt: str | None = None
    goal_id: str | None = None
    """Set on a goal-schedule slot: it links the slot stream to the goal's history."""


@event("loop.slots_missed", version=2)
class SlotsMissed(Event, frozen=True, kw_only=True):
    """Slots ``first_slot..last_slot`` passed while nothing ran; they are recorded, never fired late."""

    task_id: str
    n: int
    first_slot: int
    last_slot: int
    at: UtcTime


@event("loop.fire_succeeded", version=2)
class FireSucceeded(Event, frozen=True, kw_only=True):
    """The host accepted the slot's prompt."""

    task_id: str
    slot: int
    attempt: int = 1
    at: UtcTime
    prompt_id: str = ""


@event("loop.fire_failed", version=2)
class FireFailed(Event, frozen=True, kw_only=True):
    """The slot's fire failed; a one-shot retries the same slot at ``retry_at``, a recurring task moves on."""

    task_id: str
    slot: int
    attempt: int = 1
    at: UtcTime
    reason: str
    retry_at: UtcTime | None = None


@event("loop.session_activated", version=2)
class SessionActivated(Event, frozen=True, kw_only=True):
    """The user typed into ``session_id`` (a child session activates its root)."""

    session_id: str
    at: UtcTime


@event("loop.session_linked")
class SessionLinked(Event, frozen=True, kw_only=True):
    """``session_id`` is a child (sub-agent) of ``parent_id``."""

    session_id: str
    parent_id: str


@event("loop.session_deleted", version=2)
class SessionDeleted(Event, frozen=True, kw_only=True):
    """The session is gone; its tasks are cancelled in its own stream (``session-deleted``)."""

    session_id: str
    at: UtcTime


EPOCH_MS_FIELDS: Final[dict[str, tuple[str, ...]]] = {
    "loop.task_created": ("created_at", "next_due_at"),
    "loop.task_paused": ("at",),
    "loop.task_resumed": ("at", "next_due_at"),
    "loop.task_rescheduled": ("at", "requested_next_due_at", "next_due_at"),
    "loop.task_converted_to_fixed": ("at", "next_due_at"),
    "loop.task_cancelled": ("at",),
    "loop.task_adopted": ("at",),
    "loop.slot_claimed": ("due_at", "claimed_at", "claim_expires_at", "next_due_at"),
    "loop.slots_missed": ("at",),
    "loop.fire_succeeded": ("at",),
    "loop.fire_failed": ("at", "retry_at"),
    "loop.session_activated": ("at",),
    "loop.session_deleted": ("at",),
}
"""The instants each version-1 ``/loop`` event wrote as epoch milliseconds (version 2 writes RFC 3339 text)."""

for _type, _fields in EPOCH_MS_FIELDS.items():
    register_upcaster(_type, 1, epoch_ms_to_text(*_fields))


def _claim_without_lease(data: dict[str, Any]) -> dict[str, Any]:
    """``claimer`` became ``by``; ``claim_expires_at`` (a lease, not history) is dropped: fire records hold it now."""
    data.pop("claim_expires_at", None)
    claimer = data.pop("claimer", None)
    if claimer is not None:
        data["by"] = claimer
    return data


register_upcaster("loop.slot_claimed", 2, _claim_without_lease)
