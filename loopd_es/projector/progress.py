"""A catch-up progress bar on stderr, shown only to a person watching a terminal.

Scripts that capture stdout get no control characters; a catch-up shorter than :data:`MIN_EVENTS` or
than :data:`MIN_SECONDS` shows nothing, so everyday ``loopd-es project`` runs stay quiet.
"""

from __future__ import annotations

import sys
import time
from typing import Final, TextIO

MIN_EVENTS: Final = 10_000
MIN_SECONDS: Final = 0.5
_WIDTH: Final = 30
_EVERY: Final = 0.1


class ProgressBar:
    """``[#########.....]  45%  450,000/1,000,000 events  312k/s``, redrawn at most ten times a second."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.started = time.monotonic()
        self.first: int | None = None
        self.drawn_at = 0.0
        self.shown = False

    @classmethod
    def for_terminal(cls) -> ProgressBar | None:
        """A bar when stdout is a terminal, else None (the brief: progress only for interactive runs)."""
        return cls() if sys.stdout.isatty() else None

    def __call__(self, position: int, head: int) -> None:
        now = time.monotonic()
        if self.first is None:
            self.first = position
        if head - self.first < MIN_EVENTS or now - self.started < MIN_SECONDS or now - self.drawn_at < _EVERY:
            return
        self.drawn_at = now
        self.shown = True
        self.stream.write("\r" + render(position, head, self.first, now - self.started))
        self.stream.flush()

    def close(self) -> None:
        """End the bar's line, if one was drawn."""
        if self.shown:
            self.stream.write("\n")
            self.stream.flush()
            self.shown = False


def render(position: int, head: int, first: int, seconds: float) -> str:
    """One line of the bar for ``position`` out of ``head``, having started at ``first``."""
    total = max(head - first + 1, 1)
    done = min(max(position - first + 1, 0), total)
    filled = _WIDTH * done // total
    rate = done / seconds if seconds > 0 else 0.0
    shown_rate = f"{rate / 1000:.0f}k/s" if rate >= 1000 else f"{rate:.0f}/s"
    return (
        f"[{'#' * filled}{'.' * (_WIDTH - filled)}] {100 * done // total:3d}%  "
        f"{position:,}/{head:,} events  {shown_rate}"
    )
