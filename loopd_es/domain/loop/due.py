"""The due-time index: a heap of ``(due, session, task)`` so a tick costs O(due · log n), not O(tasks).

Entries are never removed in place: a popped entry whose task is no longer due at that time (paused,
rescheduled, fired, cancelled) is stale and dropped (:meth:`DueIndex.pop_due` takes a validator). An entry that
must wait (its session is busy) is deferred: looked at again from a later time, or as soon as :meth:`undefer`
says something changed (an event was folded), keeping the due time it is validated against. Pushed back at its
own past due time, it would be due at every tick, and a scheduler that sleeps until :meth:`DueIndex.next_at`
would spin.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from datetime import datetime


class DueIndex:
    """Min-heap of due times; ``push`` on every change, ``pop_due`` at every tick."""

    def __init__(self) -> None:
        self._heap: list[tuple[datetime, str, str, datetime]] = []
        self._deferred: dict[str, dict[str, datetime]] = {}
        """Deferred entries by session, then key: an event of one session undefers only that session's."""

    def __len__(self) -> int:
        return len(self._heap)

    def push(
        self, due: datetime | None, session_id: str, key: str, *, look_at: datetime | None = None
    ) -> None:
        """Index ``key`` as due at ``due`` (none: not due), looked at from ``look_at`` (default: ``due``) on."""
        if due is not None:
            heapq.heappush(self._heap, (due if look_at is None else max(due, look_at), session_id, key, due))

    def defer(self, due: datetime, session_id: str, key: str, until: datetime) -> None:
        """Look at ``key`` (still due at ``due``) again at ``until``, or at the next :meth:`undefer` of its
        session."""
        self.push(due, session_id, key, look_at=until)
        self._deferred.setdefault(session_id, {})[key] = due

    def undefer(self, session_id: str | None = None) -> None:
        """Make the deferred entries of ``session_id`` (default: all) due again now: what they waited on may
        have changed."""
        if not self._deferred:
            return
        sessions = list(self._deferred) if session_id is None else [session_id]
        for sid in sessions:
            for key, due in self._deferred.pop(sid, {}).items():
                self.push(due, sid, key)

    def next_at(self, current: Callable[[str, str], datetime | None] | None = None) -> datetime | None:
        """The earliest time an entry is to be looked at; with ``current`` (as for :meth:`pop_due`), stale entries
        at the front are dropped first, so a sleeper does not wake for them."""
        heap = self._heap
        while current is not None and heap and current(heap[0][1], heap[0][2]) != heap[0][3]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def pop_due(
        self, now: datetime, current: Callable[[str, str], datetime | None]
    ) -> list[tuple[datetime, str, str]]:
        """Every entry to look at by ``now`` whose ``current(session, key)`` still says its due time, as ``(due,
        session, key)``; unique."""
        out: list[tuple[datetime, str, str]] = []
        seen: set[tuple[str, str]] = set()
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, sid, key, due = heapq.heappop(heap)
            if (sid, key) in seen or current(sid, key) != due:
                continue
            seen.add((sid, key))
            out.append((due, sid, key))
        return out
