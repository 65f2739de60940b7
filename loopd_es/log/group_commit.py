"""Group commit, shared by every backend: appends that arrive together share one write and one sync.

The first appender to arrive becomes the *leader*: it yields once so that appenders already scheduled can
join, takes everything pending as one group and commits it; the others wait on an event. When the commit
is done the leader wakes the group and hands the lead to the first appender that arrived meanwhile, which
commits the next group without yielding again. A backend only supplies ``commit(group)``, which sets each
request's ``result`` or ``error``.

Promises, whatever happens to the tasks:

- Every request is validated and its payloads encoded before it joins a group (:class:`Request`), so one
  caller's bad event cannot fail another caller's append.
- Every caller gets its own true outcome: its envelopes, its own error, or — when the whole commit fails —
  that failure; never an empty result for a write that did not happen.
- Cancellation never strands anyone: a commit runs shielded from cancellation, and a cancelled leader or
  follower that was handed the lead passes it on before it leaves.
- A caller cancelled *before* its batch joined a commit appends nothing and sees the cancellation. A caller
  cancelled *after* its batch joined a commit waits for that commit (one write and one sync) and gets its
  true outcome — the recorded envelopes, or the error — and the cancellation takes effect at its next
  checkpoint. So a cancelled ``append`` that returns normally did append, and one that raises the
  cancellation did not.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final, NamedTuple

import anyio
import anyio.lowlevel
import msgspec

from ..errors import DuplicateEventIdError, LogNotFoundError, StoreUnavailableError, UsageError
from ..events.envelope import data_bytes_of
from ..private_files import make_private_dir
from .validation import resolve_retry

if TYPE_CHECKING:
    from ..events.envelope import Envelope, ExpectedVersion, NewEvent
    from .coord import Fence

_QUEUED: Final = 0
_COMMITTING: Final = 1
_DONE: Final = 2


class Part(NamedTuple):
    """One stream's share of a request: its events, their encoded payloads and the expected version."""

    stream: str
    events: Sequence[NewEvent]
    expected: ExpectedVersion
    payloads: list[bytes]


class Request:
    """One ``append`` (one part) or ``append_many`` (several parts) call waiting in a group.

    The parts land together or not at all; ``result`` holds the envelopes of every part, in part order.
    Building a request encodes every payload, so a payload that cannot be encoded fails here, alone.

    :raises UsageError: for a payload that is not one JSON object.
    """

    __slots__ = (
        "error",
        "event",
        "expected",
        "fences",
        "lead",
        "parts",
        "result",
        "state",
        "stream",
        "events",
        "task",
    )

    def __init__(self, stream: str, events: Sequence[NewEvent], expected: ExpectedVersion) -> None:
        self.parts = [Part(stream, events, expected, encode_payloads(events))]
        self.stream = stream  # the first part, for backends that commit single-part requests
        self.events = events
        self.expected = expected
        self.event: anyio.Event | None = None  # only appenders that wait for a leader need one
        self.result: list[Envelope] = []
        self.error: BaseException | None = None
        self.state = _QUEUED
        self.lead = False
        self.fences: tuple[Fence, ...] = ()
        """Coordination records that must still have these tokens for the request to land (:mod:`.coord`)."""
        self.task: int | None = None
        """The appender's task (:func:`current_task_id`), for a backend that notes it (:meth:`RecentUsers.note`)."""

    @classmethod
    def many(cls, writes: Sequence[tuple[str, Sequence[NewEvent], ExpectedVersion]]) -> Request:
        """A request whose parts (one per stream) must land together."""
        first, *rest = writes
        request = cls(*first)
        offset = len(request.events)
        for stream, events, expected in rest:  # errors count events across the whole call
            request.parts.append(Part(stream, events, expected, encode_payloads(events, offset=offset)))
            offset += len(events)
        return request

    @property
    def payloads(self) -> list[bytes]:
        """The encoded payloads of the first part."""
        return self.parts[0].payloads

    @property
    def all_events(self) -> list[NewEvent]:
        """Every event of every part, in the order they are placed."""
        if len(self.parts) == 1:
            return list(self.events)
        return [new for part in self.parts for new in part.events]

    def retry_result(self, originals: Sequence[Envelope | None]) -> list[Envelope] | None:
        """Given the recorded envelope (or None) of each of :attr:`all_events`: the originals of an exact
        retry of every part, or None when every id is new.

        :raises DuplicateEventIdError: for a reused id with other content, or a mix of recorded and new ids.
        """
        if len(self.parts) == 1:
            return resolve_retry(self.stream, self.events, originals)
        out: list[Envelope] = []
        new_parts = 0
        start = 0
        for part in self.parts:
            found = resolve_retry(part.stream, part.events, originals[start : start + len(part.events)])
            start += len(part.events)
            if found is None:
                new_parts += 1
            else:
                out.extend(found)
        if new_parts == len(self.parts):
            return None
        if new_parts:
            first = out[0]
            raise DuplicateEventIdError(
                first.event_id, first.position, first.stream, "a batch that mixes recorded and new events"
            )
        return out

    def outcome(self) -> list[Envelope]:
        if self.error is not None:
            raise self.error
        return self.result


class GroupCommitter:
    """Gathers concurrent requests into groups and runs ``commit`` on each group, one group at a time."""

    def __init__(
        self,
        commit: Callable[[list[Request]], Awaitable[None]],
        commit_now: Callable[[list[Request]], bool] | None = None,
    ) -> None:
        """``commit_now``, if given, tries a commit without awaiting (so nothing can cancel it) and says
        whether it did; otherwise, or when it did not, ``commit`` runs, shielded from cancellation."""
        self._commit = commit
        self._commit_now = commit_now
        self._pending: list[Request] = []
        self._leading = False
        self._committed: anyio.Event | None = None

    def committed(self) -> anyio.Event:
        """An event set when the next group commit finishes (``wait_for``'s in-process wake-up)."""
        if self._committed is None:
            self._committed = anyio.Event()
        return self._committed

    async def submit(self, request: Request) -> list[Envelope]:
        """Commit ``request`` (as leader or follower) and return its envelopes, or raise its error."""
        self._pending.append(request)
        if not self._leading:
            self._leading = True
            try:
                await anyio.lowlevel.checkpoint()  # let appenders that are ready join this group
            except BaseException:
                self._pending.remove(request)  # nothing of it was written
                self._hand_off()
                raise
            await self._lead()
            return request.outcome()
        event = request.event = anyio.Event()
        try:
            await event.wait()
        except BaseException:
            if request.state == _QUEUED:  # not in any commit: nothing of it was written
                self._pending.remove(request)
                if request.lead:  # we were handed the lead as we were cancelled: pass it on
                    self._hand_off()
                raise
            with anyio.CancelScope(shield=True):  # in a commit in flight: wait for the truth
                await event.wait()
        if request.state == _QUEUED:  # woken to lead the next group
            await self._lead()
        return request.outcome()

    async def _lead(self) -> None:
        """Commit everything pending as one group, wake it, and hand the lead on."""
        group, self._pending = self._pending, []
        for request in group:
            request.state = _COMMITTING
        try:
            if self._commit_now is None or not self._commit_now(group):
                with anyio.CancelScope(shield=True):  # a half-run commit would leave every outcome unknown
                    await self._commit(group)
        except BaseException as e:  # the commit as a whole failed: that is every open request's outcome
            for request in group:
                if request.error is None and not request.result:
                    request.error = e
        finally:
            for request in group:
                request.state = _DONE
                if request.event is not None:
                    request.event.set()
            if self._committed is not None:
                self._committed.set()
                self._committed = None
            self._hand_off()

    def _hand_off(self) -> None:
        """Wake the first waiting appender to lead the next group, or step down when nobody waits."""
        if not self._pending:
            self._leading = False
            return
        successor = self._pending[0]
        successor.lead = True
        assert successor.event is not None  # every request still pending after a leader's checkpoint waits
        successor.event.set()


class RecentUsers:
    """Which tasks used a store in the last few milliseconds (by :func:`current_task_id`).

    A backend that could commit on the event-loop thread asks :meth:`others` first: while other tasks are
    using the store, a sync on the event-loop thread would hold them all up (they are the appenders of the
    next group), where on a worker thread they run meanwhile and join the next group. A lone appender (a
    script, the CLI, a sequential benchmark) sees only itself and keeps the cheaper inline commit.
    """

    WINDOW_S: Final = 0.01

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        """:param monotonic: the seconds source (tests pass their own: a 10 ms window is no margin on a busy CI)."""
        self._seen: dict[int, float] = {}
        self._monotonic = monotonic

    def note(self) -> int:
        """Record that the current task is using the store now; returns its id (for :meth:`others`)."""
        now = self._monotonic()
        me = current_task_id()
        self._seen[me] = now
        if len(self._seen) > 256:  # a read-only crowd never commits: keep the record to the window anyway
            self._forget(now)
        return me

    def others(self, me: int | None = None) -> bool:
        """Whether a task other than ``me`` (default: the current one) used the store within :attr:`WINDOW_S`.

        A caller that noted its task passes the id :meth:`note` returned: looking the task up costs more
        than the rest of this check.
        """
        if me is None:
            me = current_task_id()
        seen = self._seen
        if len(seen) == 1 and me in seen:  # a lone appender: nobody else to forget or find
            return False
        self._forget(self._monotonic())
        return any(task != me for task in seen)

    def __len__(self) -> int:
        """How many tasks the record holds (at most those of the window, once it has grown past 256)."""
        return len(self._seen)

    def _forget(self, now: float) -> None:
        seen = self._seen
        for task in [t for t, at in seen.items() if now - at > self.WINDOW_S]:
            del seen[task]


def current_task_id() -> int:
    """An id of the current task, unique among running tasks: ``id()`` of the asyncio task, else anyio's id.

    ``anyio.get_current_task()`` builds a whole ``TaskInfo`` (name, parent, coroutine) for the id alone; on
    asyncio that costs a lone append about 5 us of its time between two fsyncs.
    """
    try:
        return id(asyncio.current_task())
    except RuntimeError:  # no asyncio loop in this thread: another anyio backend
        return anyio.get_current_task().id


def encode_payloads(events: Sequence[NewEvent], offset: int = 0) -> list[bytes]:
    """Every event's payload as the JSON bytes that will be stored, encoded once, before any commit.

    :raises UsageError: naming the first event whose payload cannot be encoded as JSON.
    """
    try:
        return data_bytes_of(events)
    except (msgspec.EncodeError, TypeError, ValueError, OverflowError):
        for i, new in enumerate(events):
            try:
                new.data_bytes()
            except (msgspec.EncodeError, TypeError, ValueError, OverflowError) as e:
                raise UsageError(
                    f"event {offset + i + 1} of the batch: data cannot be encoded as JSON ({e}); "
                    "use only strings, numbers, booleans, null, lists and objects"
                ) from None
        raise


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
        make_private_dir(path.parent)
    except OSError as e:
        raise StoreUnavailableError(
            f"cannot create {path.parent}: {e.strerror}; check --store and the directory's permissions"
        ) from e
