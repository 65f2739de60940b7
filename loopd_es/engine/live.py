"""What the engine knows about each goal beyond its folded state: session index, activity, timers.

Activity (messages, tool calls, busy signals) is a hint the host repeats, so it stays in memory; what a
decision rests on (an idle candidate and when it was staged, a failed confirmation, a run's start) comes from
events, so :meth:`Tracker.observe` rebuilds it from the log after a restart. Timers live in one heap keyed by
``(goal, kind)``; a popped timer is checked against the goal's state before it acts, so a stale entry costs a
lookup and nothing else. Nothing here scans all goals per event.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Literal

from ..clock import parse_rfc3339
from ..domain.streams import aggregate_of

if TYPE_CHECKING:
    from ..events.envelope import Envelope

TimerKind = Literal["confirm", "retry"]


@dataclass
class Live:
    """One goal's in-memory facts."""

    goal_id: str
    session_id: str | None = None
    generation: int = 0
    run_started_at: datetime | None = None
    last_activity: datetime | None = None
    tools: dict[str, datetime] = field(default_factory=dict)
    assistant_id: str | None = None
    assistant_completed_at: datetime | None = None
    candidate_at: datetime | None = None
    candidate_generation: int | None = None
    confirm_failed_at: datetime | None = None
    status: str | None = None
    unknown_count: int = 0
    unreachable_notified: bool = False
    proven: bool = False
    """The last idle signal confirmed a turn its transcript proved over (kept across the next run's start)."""
    watched_since: datetime | None = None
    """When this engine took the goal's running turn over (a restart, an adoption): what happened before, an
    idle included, it never heard, so the turn's quiet is counted from here."""

    def new_generation(self, generation: int, at: datetime | None) -> None:
        """A new run started: forget the previous run's markers."""
        self.generation = generation
        self.run_started_at = at
        self.last_activity = at
        self.tools.clear()
        self.assistant_id = None
        self.assistant_completed_at = None
        self.candidate_at = None
        self.candidate_generation = None
        self.confirm_failed_at = None

    def activity(self, now: datetime) -> None:
        self.last_activity = now

    def quiet_since(self) -> datetime | None:
        """Since when the running turn has been quiet as this engine saw it: its last activity or its start,
        and never before the engine took it over (``None`` when nothing is known)."""
        marks = [m for m in (self.last_activity, self.run_started_at, self.watched_since) if m is not None]
        return max(marks) if marks else None


class Tracker:
    """The per-goal facts of every goal the engine has seen, and the timer heap."""

    def __init__(self) -> None:
        self.goals: dict[str, Live] = {}
        self.sessions: dict[str, str] = {}
        self._heap: list[tuple[datetime, int, str, TimerKind]] = []
        self._due: dict[tuple[str, TimerKind], datetime] = {}
        self._seq = 0

    def live(self, goal_id: str) -> Live:
        found = self.goals.get(goal_id)
        if found is None:
            found = self.goals[goal_id] = Live(goal_id)
        return found

    def goal_of_session(self, session_id: str) -> str | None:
        return self.sessions.get(session_id)

    def observe(self, env: Envelope) -> str | None:
        """Update from one log event; returns the goal id it concerns (``None`` for other streams)."""
        kind, goal_id = aggregate_of(env.stream)
        if kind != "goal":
            return None
        t = env.type
        if t in (
            "run.started",
            "run.idle_candidate",
            "run.confirm_failed",
            "goal.worker_assigned",
            "goal.cleared",
        ):
            data = env.data_dict()
            live = self.live(goal_id)
            if t == "goal.worker_assigned":
                live.session_id = data["worker_session_id"]
                self.sessions[data["worker_session_id"]] = goal_id
            elif t == "goal.cleared":
                if live.session_id is not None:
                    self.sessions.pop(live.session_id, None)
                self.goals.pop(goal_id, None)
                self.cancel(goal_id)
            elif t == "run.started":
                live.new_generation(int(data["generation"]), _at(data, env))
            elif t == "run.idle_candidate":
                live.candidate_at = _at(data, env)
                live.candidate_generation = int(data["generation"])
            elif t == "run.confirm_failed":
                live.confirm_failed_at = _at(data, env)
        return goal_id

    # -- timers ----------------------------------------------------------------------------------------

    def schedule(self, goal_id: str, kind: TimerKind, due: datetime) -> None:
        """Run ``kind`` for ``goal_id`` at ``due`` (an earlier or equal pending one is kept)."""
        key = (goal_id, kind)
        current = self._due.get(key)
        if current is not None and current <= due:
            return
        self._due[key] = due
        self._seq += 1
        heapq.heappush(self._heap, (due, self._seq, goal_id, kind))

    def cancel(self, goal_id: str) -> None:
        for kind in ("confirm", "retry"):
            self._due.pop((goal_id, kind), None)

    def pop_due(self, now: datetime) -> list[tuple[str, TimerKind]]:
        """Every timer due at ``now``, earliest first (each at most once)."""
        due: list[tuple[str, TimerKind]] = []
        while self._heap and self._heap[0][0] <= now:
            when, _, goal_id, kind = heapq.heappop(self._heap)
            if self._due.get((goal_id, kind)) == when:
                del self._due[(goal_id, kind)]
                due.append((goal_id, kind))
        return due

    def next_due(self) -> datetime | None:
        while self._heap and self._due.get((self._heap[0][2], self._heap[0][3])) != self._heap[0][0]:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None


def _at(data: dict[str, object], env: Envelope) -> datetime:
    at = data.get("at")
    if isinstance(at, str) and at:
        return parse_rfc3339(at)
    return parse_rfc3339(env.recorded_at)


def after(moment: datetime, ms: float) -> datetime:
    return moment + timedelta(milliseconds=ms)
