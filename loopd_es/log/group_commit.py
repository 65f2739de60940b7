"""Group commit, shared by every backend: appends that arrive together share one write and one sync.

The first appender to arrive becomes the *leader*: it yields once so that appenders already scheduled can
join, then commits everything pending in one go, and repeats while more arrived meanwhile. The others
wait on an event the leader sets. A backend only supplies ``commit(group)``, which sets each request's
``result`` or ``error``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel

from ..errors import LogNotFoundError, LoopdError, StoreUnavailableError

if TYPE_CHECKING:
    from ..events.envelope import Envelope, ExpectedVersion, NewEvent


class Request:
    """One ``append`` call waiting in a group: its batch, and the outcome the commit leaves on it."""

    __slots__ = ("error", "event", "events", "expected", "result", "stream")

    def __init__(self, stream: str, events: Sequence[NewEvent], expected: ExpectedVersion) -> None:
        self.stream = stream
        self.events = events
        self.expected = expected
        self.event: anyio.Event | None = None  # only appenders that wait for a leader need one
        self.result: list[Envelope] = []
        self.error: BaseException | None = None


class GroupCommitter:
    """Gathers concurrent requests into groups and runs ``commit`` on each group, one group at a time.

    The leader does not yield again after a commit: the appenders it released re-enter in the next loop
    iteration and form the next group around the next leader. (Yielding once more proved to split every
    wave of 16 writers into two groups of 8.)
    """

    def __init__(self, commit: Callable[[list[Request]], Awaitable[None]]) -> None:
        self._commit = commit
        self._pending: list[Request] = []
        self._leading = False

    async def submit(self, request: Request) -> list[Envelope]:
        """Commit ``request`` (as leader or follower) and return its envelopes, or raise its error."""
        self._pending.append(request)
        if self._leading:
            request.event = anyio.Event()
            await request.event.wait()
        else:
            self._leading = True
            try:
                await anyio.lowlevel.checkpoint()  # let appenders that are ready join this group
                while self._pending:
                    group, self._pending = self._pending, []
                    await self._run(group)
            finally:
                self._leading = False
        if request.error is not None:
            raise request.error
        return request.result

    async def _run(self, group: list[Request]) -> None:
        try:
            await self._commit(group)
        except LoopdError as e:  # the whole group failed: every request that has no outcome gets the error
            for request in group:
                if request.error is None and not request.result:
                    request.error = e
        finally:
            for request in group:
                if request.event is not None:
                    request.event.set()


def prepare_path(path: Path, *, create: bool) -> None:
    """Make sure the log's directory exists (``create``) or that the log does (otherwise).

    :raises LogNotFoundError: when the log does not exist and ``create`` is false.
    :raises StoreUnavailableError: when the directory cannot be created.
    """
    if not create:
        if not path.exists():
            raise LogNotFoundError(str(path))
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StoreUnavailableError(
            f"cannot create {path.parent}: {e.strerror}; check --store and the directory's permissions"
        ) from e
