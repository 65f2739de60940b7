"""What a log's events must keep, checked as they are read or copied: gapless positions, contiguous versions.

Every backend's ``verify`` reports in a :class:`VerifyReport`; a copy (``export``, ``import``) checks order as it
reads (:func:`in_order`), so a damaged source is named, not copied.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from ..errors import CorruptLogError

if TYPE_CHECKING:
    from ..events.envelope import Envelope


class SequenceChecker:
    """Checks that copied envelopes keep the log's invariants: positions 1, 2, 3 ... and contiguous versions."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.position = 0
        self.versions: dict[str, int] = {}

    def check(self, env: Envelope) -> None:
        if env.position != self.position + 1:
            raise CorruptLogError(
                self.where, None, f"expected position {self.position + 1}, got {env.position}"
            )
        expected = self.versions.get(env.stream, 0) + 1
        if env.version != expected:
            raise CorruptLogError(
                self.where, None, f"stream {env.stream!r}: expected version {expected}, got {env.version}"
            )
        self.position = env.position
        self.versions[env.stream] = env.version


async def in_order(where: str, batches: AsyncIterator[list[Envelope]]) -> AsyncIterator[list[Envelope]]:
    """``batches``, checked as a :class:`SequenceChecker` naming ``where`` (the log they are read from) checks
    them, inline: a copy reads every event of a log, and a call per event cost as much as reading it."""
    position = 0
    versions: dict[str, int] = {}
    get = versions.get
    async for batch in batches:
        for env in batch:
            position += 1
            stream = env.stream
            version = get(stream, 0) + 1
            if env.position != position:
                raise CorruptLogError(where, None, f"expected position {position}, got {env.position}")
            if env.version != version:
                raise CorruptLogError(
                    where, None, f"stream {stream!r}: expected version {version}, got {env.version}"
                )
            versions[stream] = version
        yield batch


def check_contiguous(where: str, stream: str, first: int, last: int, count: int) -> None:
    """Check that ``count`` events of ``stream`` read in version order run from ``first`` to ``last``.

    :raises CorruptLogError: when they do not (a gap in the stream's versions, which ``verify`` also finds).
    """
    if last - first + 1 != count:
        raise CorruptLogError(
            where, None, f"stream {stream!r} has a gap in its versions between {first} and {last}"
        )


class VerifyReport:
    """What ``verify`` found: counts, problems (each a sentence saying where), and what a repair did."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.events = 0
        self.streams = 0
        self.problems: list[str] = []
        self.notes: list[str] = []
        """What is worth knowing but not a problem, e.g. a log written before checksums."""
        self.repaired: list[str] = []
        self.torn_offset: int | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        state = "clean" if self.ok else f"{len(self.problems)} problem(s)"
        return f"{self.url}: {self.events} events in {self.streams} streams: {state}"
