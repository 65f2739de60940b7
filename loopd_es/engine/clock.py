"""Time as an input: the engine asks a :class:`Clock`, so tests drive it with a :class:`FakeClock`.

Every timer the engine keeps (a retry's ``retry_after``, an idle candidate's confirmation, a lease's expiry)
is computed from a time recorded in an event, never from when this process happened to start, so a restarted
engine resumes them where they were.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    """Where the engine reads the time."""

    def now(self) -> datetime:
        """The current time, timezone-aware (UTC)."""
        ...


class SystemClock:
    """The wall clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)


class FakeClock:
    """A clock that moves only when a test says so."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)

    def now(self) -> datetime:
        return self._now

    def advance(self, seconds: float) -> datetime:
        """Move ``seconds`` forward and return the new time."""
        self._now += timedelta(seconds=seconds)
        return self._now

    def __call__(self) -> datetime:
        return self._now


def parse_iso(text: str) -> datetime:
    """An ISO time as events record it (``...Z`` or with an offset) as an aware datetime."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))
