"""The due-time index: a heap of ``(due, session, task)`` so a tick costs O(due · log n), not O(tasks).

Entries are never removed in place: a popped entry whose task is no longer due at that time (paused,
rescheduled, fired, cancelled) is stale and dropped (:meth:`DueIndex.pop_due` takes a validator).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from datetime import datetime


class DueIndex:
    """Min-heap of due times; ``push`` on every change, ``pop_due`` at every tick."""

    def __init__(self) -> None:
        self._heap: list[tuple[datetime, str, str]] = []

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, due: datetime | None, session_id: str, key: str) -> None:
        if due is not None:
            heapq.heappush(self._heap, (due, session_id, key))

    def next_at(self) -> datetime | None:
        """The earliest due time in the heap (possibly stale, so possibly early: callers just look again)."""
        return self._heap[0][0] if self._heap else None

    def pop_due(
        self, now: datetime, current: Callable[[str, str], datetime | None]
    ) -> list[tuple[datetime, str, str]]:
        """Every entry due at ``now`` whose ``current(session, key)`` still says that due time; unique."""
        out: list[tuple[datetime, str, str]] = []
        seen: set[tuple[str, str]] = set()
        heap = self._heap
        while heap and heap[0][0] <= now:
            due, sid, key = heapq.heappop(heap)
            if (sid, key) in seen or current(sid, key) != due:
                continue
            seen.add((sid, key))
            out.append((due, sid, key))
        return out
