"""State of scheduled loops, folded from ``loop.*`` events; pure (no I/O) and replay-deterministic.

:class:`SessionLoops` is one ``loop-session-<id>`` stream: its tasks in creation order and the stream
version a decision was made at (the expected version of the append that records it). :func:`evolve` only
copies decisions out of events - it never recomputes a due time - so a replay gives the same schedule.
Instants are aware UTC datetimes; durations (intervals, bounds, the TTL) are milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Final

from ...clock import EPOCH, from_ms_held, to_ms
from ...events import loop as ev

if TYPE_CHECKING:
    from ...events.base import Event

TTL_MS: Final = 7 * 86_400_000
_TTL: Final = timedelta(milliseconds=TTL_MS)
RECENT: Final = 5


@dataclass(slots=True)
class Fire:
    """A fire the log shows started (``loop.slot_claimed``) and not yet ended (no outcome recorded).

    Whether its scheduler is still at it is not in the log: see :class:`InFlight`.
    """

    slot: int
    attempt: int
    by: str
    due_at: datetime
    claimed_at: datetime


@dataclass(frozen=True, slots=True)
class InFlight:
    """A session's live fire record, read from coordination beside the log (an outside fact for the deciders).

    ``task_id`` is firing ``slot``/``attempt`` and its scheduler holds the record until ``until`` (renewing it
    while the host call lasts). A started fire that no live record names has lost its scheduler.
    """

    task_id: str
    slot: int
    attempt: int
    until: datetime

    def names(self, task_id: str, fire: Fire) -> bool:
        """Whether this record is the one of ``fire`` of ``task_id``."""
        return (self.task_id, self.slot, self.attempt) == (task_id, fire.slot, fire.attempt)


@dataclass(slots=True)
class Task:
    """One ``/loop`` task as of the last folded event."""

    task_id: str
    origin_id: str
    session_id: str
    prompt: str
    mode: ev.Mode
    interval_ms: int | None
    jitter: bool | None
    once: bool
    adaptive_min_ms: int | None
    adaptive_max_ms: int | None
    source: str
    via: str
    directory: str
    loop_file_path: str | None
    content_hash: str | None
    owner: str | None
    durable: bool
    created_at: datetime
    last_fired_at: datetime | None
    """``None`` until a fire (or a creation that ran at once)."""
    next_due_at: datetime | None
    next_slot: int = 1
    next_attempt: int = 1
    anchor: datetime = EPOCH
    """Where the grid of a fixed or maintenance task starts: step ``n`` is due ``anchor + (n + 1) * period``."""
    cycle: int = 0
    paused: bool = False
    cancelled: ev.CancelReason | None = None
    firing: Fire | None = None
    """The fire started and not ended, if any (it blocks the task's next fire until its outcome)."""
    fires: int = 0
    failures: int = 0
    missed: int = 0
    last_outcome: str | None = None
    recent: list[tuple[int, str, datetime]] = field(default_factory=list)
    """The last few fires as ``(slot, outcome, at)``, for ``loop_status`` (the reference returned none)."""

    @property
    def live(self) -> bool:
        return self.cancelled is None

    @property
    def period_ms(self) -> int | None:
        """The grid step: the interval of a fixed task, the period of a maintenance task, none for adaptive."""
        if self.mode == "fixed":
            return self.interval_ms
        if self.mode == "maintenance":
            return self.adaptive_max_ms
        return None

    def expires_at(self) -> datetime:
        """When the task is idle too long (7 days after its last activity)."""
        last = self.created_at if self.last_fired_at is None else max(self.created_at, self.last_fired_at)
        return last + _TTL

    def due_at(self) -> datetime | None:
        """When the task next wants to fire, ``None`` when it never will (paused, cancelled, firing)."""
        if not self.live or self.paused or self.firing is not None:
            return None
        return self.next_due_at


@dataclass(slots=True)
class SessionLoops:
    """One session's stream: tasks in creation order and the version they were folded at."""

    session_id: str
    version: int = 0
    tasks: dict[str, Task] = field(default_factory=dict)

    def live(self) -> list[Task]:
        return [t for t in self.tasks.values() if t.live]

    def by_origin(self, origin_id: str) -> Task | None:
        return next((t for t in self.tasks.values() if t.origin_id == origin_id), None)

    def started(self) -> list[Task]:
        """The tasks with a fire started and not ended (a task cancelled meanwhile too: its fire still ends)."""
        return [t for t in self.tasks.values() if t.firing is not None]


def evolve(s: SessionLoops, e: Event) -> None:
    """Apply one event of the session's stream to ``s`` (in place; the caller bumps ``version``)."""
    if isinstance(e, ev.TaskCreated):
        s.tasks[e.task_id] = Task(
            task_id=e.task_id, origin_id=e.origin_id, session_id=e.session_id, prompt=e.prompt, mode=e.mode,
            interval_ms=e.interval_ms, jitter=e.jitter, once=e.once, adaptive_min_ms=e.adaptive_min_ms,
            adaptive_max_ms=e.adaptive_max_ms, source=e.source, via=e.via, directory=e.directory,
            loop_file_path=e.loop_file_path, content_hash=e.content_hash, owner=e.owner, durable=e.durable,
            created_at=e.created_at, last_fired_at=e.created_at if e.ran_on_creation else None,
            next_due_at=e.next_due_at, anchor=e.created_at,
        )  # fmt: skip
        return
    task = s.tasks.get(getattr(e, "task_id", ""))
    if task is None:
        return
    if isinstance(e, ev.TaskPaused):
        task.paused = True
    elif isinstance(e, ev.TaskResumed):
        task.paused = False
        task.anchor, task.cycle, task.next_due_at = e.at, 0, e.next_due_at
    elif isinstance(e, ev.TaskRescheduled):
        task.next_due_at = e.next_due_at
        if task.period_ms is not None:
            task.anchor, task.cycle = from_ms_held(to_ms(e.next_due_at) - task.period_ms), 0
    elif isinstance(e, ev.TaskConvertedToFixed):
        task.mode, task.interval_ms, task.jitter = "fixed", e.interval_ms, e.jitter
        task.adaptive_min_ms = task.adaptive_max_ms = None
        task.anchor, task.cycle, task.next_due_at, task.last_fired_at = e.at, 0, e.next_due_at, e.at
    elif isinstance(e, ev.TaskCancelled):
        task.cancelled = e.reason  # a started fire stays: its scheduler still records the outcome
    elif isinstance(e, ev.TaskAdopted):
        task.owner = e.owner
    elif isinstance(e, ev.SlotsMissed):
        task.missed += e.n
        task.cycle += e.n
    elif isinstance(e, ev.SlotClaimed):
        _claimed(task, e)
    elif isinstance(e, ev.FireSucceeded):
        task.firing, task.last_outcome = None, "succeeded"
        task.fires += 1
        task.recent = [*task.recent[-(RECENT - 1) :], (e.slot, "succeeded", e.at)]
        if task.mode != "adaptive":  # the reference's lastFiredAt: completion time, adaptive: fire start
            task.last_fired_at = e.at
    elif isinstance(e, ev.FireFailed):
        task.firing, task.last_outcome = None, f"failed: {e.reason}"
        task.failures += 1
        task.recent = [*task.recent[-(RECENT - 1) :], (e.slot, f"failed: {e.reason}", e.at)]
        if e.retry_at is not None:
            task.next_slot, task.next_attempt, task.next_due_at = e.slot, e.attempt + 1, e.retry_at


def _claimed(task: Task, e: ev.SlotClaimed) -> None:
    task.firing = Fire(slot=e.slot, attempt=e.attempt, by=e.by, due_at=e.due_at, claimed_at=e.claimed_at)
    task.next_slot, task.next_attempt, task.cycle = e.slot + 1, 1, task.cycle + 1
    task.next_due_at = e.next_due_at
    if task.mode == "adaptive":
        task.last_fired_at = e.claimed_at
    if e.prompt is not None:
        task.prompt = e.prompt
    if e.content_hash is not None:
        task.content_hash = e.content_hash


def fold(session_id: str, events: list[Event]) -> SessionLoops:
    """The session state after ``events`` (its whole stream, in order)."""
    s = SessionLoops(session_id=session_id)
    for e in events:
        evolve(s, e)
        s.version += 1
    return s
