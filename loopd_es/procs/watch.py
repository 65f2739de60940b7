"""The watch state machine: which output lines become pushes, and when (docs/reference/loopd.md#s2-4, #s3-17,
#s5).

Pure and clock-injected (every call takes ``now`` in seconds), so the limits are tested without
processes or sleeps; the supervisor feeds it lines and appends the events it returns.

``active → until-matched`` on the first until line; ``→ flood-suspended`` above 100 lines in a sliding
second; ``→ budget-exhausted`` on the 31st push. Suspended and exhausted watches only count drops.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Final

from ..domain.command import compile_watch_regex
from ..events.command import WatchMatched, WatchSpec, WatchSuspended

if TYPE_CHECKING:
    from ..events.base import Event

COALESCE_WINDOW_S: Final = 2.0
MAX_LINES_PER_PUSH: Final = 20
MAX_BYTES_PER_PUSH: Final = 4096
MAX_PUSHES: Final = 30
FLOOD_LINES_PER_S: Final = 100
MAX_MESSAGE_BYTES: Final = 4096


def _bounded(text: str, limit: int = MAX_MESSAGE_BYTES) -> str:
    data = text.encode()
    return text if len(data) <= limit else data[-limit:].decode("utf-8", "ignore")


class Watcher:
    """One command's watch: feed it clean non-blank lines, call :meth:`due` when :attr:`deadline` passes."""

    def __init__(
        self,
        command_id: str,
        title: str,
        spec: WatchSpec,
        *,
        pushes: int = 0,
        matches: int = 0,
        state: str = "active",
    ) -> None:
        self.command_id = command_id
        self.title = title
        self.spec = spec
        self._filter = compile_watch_regex("filter", spec.filter, spec.ignore_case) if spec.filter else None
        self._until = compile_watch_regex("until", spec.until, spec.ignore_case) if spec.until else None
        self.state = state
        self.pushes = pushes
        self.matches = matches
        self.dropped = 0
        self.deadline: float | None = None
        self.until_matched = False
        self._buffer: list[str] = []
        self._recent: deque[str] = deque(maxlen=MAX_LINES_PER_PUSH)
        self._times: deque[float] = deque()

    @property
    def suspended(self) -> bool:
        return self.state in ("flood-suspended", "budget-exhausted")

    def feed(self, line: str, now: float) -> list[Event]:
        """One clean, non-blank line; returns the events it causes right away (flood notice, until push)."""
        if self.suspended:
            self.dropped += 1
            return []
        times = self._times
        times.append(now)
        while times and times[0] <= now - 1.0:
            times.popleft()
        if len(times) > FLOOD_LINES_PER_S:
            return [self._suspend_flood()]
        if self._filter is not None and not self._filter.search(line):
            return []
        self._recent.append(line)
        if self._until is not None and self.state == "active" and self._until.search(line):
            return [self._until_push(line)]
        if self._filter is None:
            return []  # an until-only watch pushes nothing but its match
        self.matches += 1
        self._buffer.append(line)
        if self.deadline is None:
            self.deadline = now + COALESCE_WINDOW_S
        return []

    def due(self, now: float) -> list[Event]:
        """The coalesced push whose window has closed (leftover lines get the next window)."""
        if self.deadline is None or now < self.deadline:
            return []
        self.deadline = None
        events = self._push(at_exit=False)
        if self._buffer and not self.suspended:
            self.deadline = now + COALESCE_WINDOW_S
        return events

    def at_exit(self) -> list[Event]:
        """The final push of whatever is buffered when the process exits."""
        self.deadline = None
        return self._push(at_exit=True) if self._buffer else []

    # -- internals --------------------------------------------------------------------------------

    def _take(self) -> list[str]:
        batch: list[str] = []
        size = 0
        for line in self._buffer:
            n = len(line.encode()) + 1
            if batch and (len(batch) >= MAX_LINES_PER_PUSH or size + n > MAX_BYTES_PER_PUSH):
                break
            batch.append(line)
            size += n
        del self._buffer[: len(batch)]
        return batch

    def _push(self, at_exit: bool) -> list[Event]:
        if not self._buffer or self.suspended:
            return []
        if self.pushes >= MAX_PUSHES:
            self.state = "budget-exhausted"
            self.dropped += len(self._buffer)
            self._buffer.clear()
            text = (
                f'[watch "{self.title}"] BUDGET: push limit ({MAX_PUSHES}) reached. Watch exhausted; '
                "further matches are dropped. The process keeps running."
            )
            return [
                WatchSuspended(
                    command_id=self.command_id,
                    reason="budget",
                    pushes=self.pushes,
                    dropped=self.dropped,
                    at_exit=at_exit,
                    text=text,
                )
            ]
        batch = self._take() if not at_exit else self._buffer[:]
        if at_exit:
            self._buffer.clear()
        self.pushes += 1
        text = _bounded(f'[watch "{self.title}"]\n' + "\n".join(batch))
        return [
            WatchMatched(
                command_id=self.command_id,
                lines=len(batch),
                matches=self.matches,
                pushes=self.pushes,
                at_exit=at_exit,
                text=text,
            )
        ]

    def _until_push(self, line: str) -> Event:
        self.state = "until-matched"
        self.until_matched = True
        self.matches += 1
        self.pushes += 1  # the until push outranks the budget
        self._buffer.clear()
        self.deadline = None
        lines = list(self._recent)
        note = f'-- until "{self.spec.until}" matched (action={self.spec.until_action})'
        body = "\n".join(lines)
        text = f'[watch "{self.title}"]\n' + _bounded(body, MAX_MESSAGE_BYTES - 200) + "\n" + note
        return WatchMatched(
            command_id=self.command_id,
            lines=len(lines),
            matches=self.matches,
            pushes=self.pushes,
            until=self.spec.until,
            text=text,
        )

    def _suspend_flood(self) -> Event:
        self.state = "flood-suspended"
        self.dropped += len(self._buffer) + 1
        self._buffer.clear()
        self.deadline = None
        text = (
            f'[watch "{self.title}"] FLOOD: {FLOOD_LINES_PER_S}+ lines/sec exceeds the limit. Watch suspended '
            f"({self.dropped} line(s) dropped so far); the process keeps running."
        )
        return WatchSuspended(
            command_id=self.command_id, reason="flood", pushes=self.pushes, dropped=self.dropped, text=text
        )
