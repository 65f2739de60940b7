"""The store contract every log backend keeps.

A log is a sequence of :class:`~loopd_es.events.Envelope` with gapless global positions (1, 2, 3, ...),
split into streams whose versions are contiguous (1, 2, 3, ...). It only grows: nothing is ever edited,
deleted or reordered, and an acknowledged append survives a crash of the process that made it.
"""

from __future__ import annotations

import abc
import functools
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, ClassVar, Final, NamedTuple, Self

from ..errors import StreamNotFoundError, UsageError
from ..events.envelope import (
    ANY,
    EXISTS,
    NO_STREAM,
    Envelope,
    ExpectedVersion,
    Foldable,
    LogRows,
    NewEvent,
    StreamRows,
)
from .coord import Claim, Fence, check_key
from .invariants import VerifyReport, check_contiguous, in_order

if TYPE_CHECKING:
    import anyio

    from .group_commit import Request

READ_BATCH = 4096
"""Events read per storage round trip: large enough to amortise a thread hop, small enough for bounded memory."""


class NeedsEventLoop(Exception):
    """A one-shot query run without an event loop met work that needs one (a read model behind the log, a
    log to create): nothing was printed or written yet, and the command runs again with the loop."""


class StreamWrite(NamedTuple):
    """One stream's share of an :meth:`LogStore.append_many`: its events and the version it must be at."""

    stream: str
    events: Sequence[NewEvent]
    expected_version: ExpectedVersion = ANY


WriteSpec = StreamWrite | tuple[str, Sequence[NewEvent]] | tuple[str, Sequence[NewEvent], ExpectedVersion]
"""A :class:`StreamWrite`, or the same as a plain tuple."""


class LogStore(abc.ABC):
    """An append-only event log; use it as an async context manager (or call :meth:`aclose`)."""

    url: str
    read_only: ClassVar[bool] = False
    """True for a log that refuses every write (a bundle): readers that would keep files beside it don't."""
    loopless: ClassVar[bool] = False
    """True for a store whose calls never suspend (:mod:`.sqlite_snapshot`, for a one-shot query run without an
    event loop): a reader with work that needs the loop (catching a read model up) raises
    :class:`NeedsEventLoop` instead of starting it."""

    async def append(
        self,
        stream: str,
        events: Sequence[NewEvent],
        expected_version: ExpectedVersion = ANY,
        *,
        fences: Sequence[Fence] = (),
    ) -> list[Envelope]:
        """Append ``events`` to ``stream`` atomically and return their recorded envelopes.

        The batch lands whole or not at all, and only if the stream is at ``expected_version``: an exact
        version (0 means the stream has no events), ``no_stream``, ``exists`` or ``any``. Resending a batch
        whose event ids are all already recorded with identical content returns the original envelopes
        and writes nothing, whatever the expected version. An empty batch writes nothing and returns ``[]``.
        With ``fences``, the batch lands only if every fenced coordination record still has its token
        (:mod:`.coord`), checked in the same transaction; the fence itself writes nothing.

        :raises WrongExpectedVersionError: when the stream is not at the expected version.
        :raises DuplicateEventIdError: when an event id is already recorded with different content, or a
            batch mixes recorded and new ids.
        :raises FenceLostError: when a fenced record no longer has the fence's token (nothing lands).
        :raises UsageError: for an invalid stream name, event type or expected version.
        :raises StorageError: when the log cannot be written durably.
        """
        request_type, check_new_events = _append_tools()
        check_stream_name(stream)
        expected_version = parse_expected_version(expected_version)
        events = check_new_events(events)
        if not events:
            return []
        request = request_type(stream, events, expected_version)
        if fences:
            request.fences = _checked_fences(fences)
        return await self._submit(request)

    async def append_many(
        self, writes: Sequence[WriteSpec], *, fences: Sequence[Fence] = ()
    ) -> list[list[Envelope]]:
        """Append to several streams atomically: every write lands, or none does.

        Each write names a different stream and carries its own expected version; the events get
        contiguous positions in the order of ``writes``. Resending the same writes after they landed
        returns the original envelopes, as for :meth:`append`. Returns each write's envelopes.

        :raises WrongExpectedVersionError: when any stream is not at its expected version (nothing lands).
        :raises DuplicateEventIdError: as for :meth:`append`.
        :raises FenceLostError: as for :meth:`append`.
        :raises UsageError: for no writes, a stream named twice, or any invalid stream, event or version.
        :raises StorageError: when the log cannot be written durably.
        """
        request_type, check_new_events = _append_tools()
        checked: list[tuple[str, Sequence[NewEvent], ExpectedVersion]] = []
        seen: set[str] = set()
        ids: set[str] = set()
        for write in writes:
            stream, events, expected = StreamWrite(*write)
            check_stream_name(stream)
            if stream in seen:
                raise UsageError(
                    f"stream {stream!r} appears twice in one append_many; put its events in one write"
                )
            seen.add(stream)
            events = check_new_events(events)
            if not events:
                raise UsageError(f"the write to stream {stream!r} has no events; leave it out")
            for new in events:
                if new.event_id in ids:
                    raise UsageError(f"event id {new.event_id} appears twice in one append_many")
                ids.add(new.event_id)
            checked.append((stream, events, parse_expected_version(expected)))
        if not checked:
            raise UsageError("append_many needs at least one write")
        request = request_type.many(checked)
        request.fences = _checked_fences(fences)
        recorded = await self._submit(request)
        out: list[list[Envelope]] = []
        start = 0
        for _stream, events, _expected in checked:
            out.append(recorded[start : start + len(events)])
            start += len(events)
        return out

    @abc.abstractmethod
    async def _submit(self, request: Request) -> list[Envelope]:
        """Commit a validated request (all its parts or none), e.g. through the backend's group commit.

        :data:`append` and :meth:`append_many` check and encode everything before they call it.
        """

    @abc.abstractmethod
    async def coord_read(self, prefix: str = "") -> list[Claim]:
        """The coordination records whose key starts with ``prefix``, ordered by key (:mod:`.coord`).

        :raises StorageError: when the store cannot be read.
        """

    @abc.abstractmethod
    async def coord_swap(self, key: str, expected_token: int, new: Claim | None) -> Claim | None:
        """Set record ``key`` to ``new`` (or delete it, for None) if its token is still ``expected_token``.

        A missing record has token 0. Returns None when the change was made, else the record found (a missing
        one as a record with token 0), so a contender learns who won. Only delete keys that nobody fences on:
        a deleted key's tokens start again from 1.

        :raises UsageError: for an invalid key or record.
        :raises StorageError: when the store cannot be written durably.
        """

    @abc.abstractmethod
    def read_batches(
        self,
        *,
        from_position: int = 1,
        limit: int | None = None,
        stream: str | None = None,
        from_version: int = 1,
    ) -> AsyncIterator[list[Envelope]]:
        """Yield envelopes in global order, a bounded batch at a time.

        With ``stream``, yield only that stream's events from ``from_version`` on (``from_position`` is then
        ignored). ``limit`` bounds the number of events in total.

        :raises CorruptLogError: when a complete record cannot be decoded or breaks the log's invariants.
        """

    async def read_for_copy(self) -> AsyncIterator[list[Envelope]]:
        """The whole log for ``export``/``import``: :meth:`read_batches`, each record checked as far as this
        backend can check it cheaply (SQLite: each row's checksum) and the log's invariants checked, so a
        damaged record is named in this log and never copied into another.

        :raises CorruptLogError: naming this log and the damaged record.
        """
        async for batch in in_order(self.url, self.read_batches()):
            yield batch

    def read_recorded(
        self,
        *,
        from_position: int = 1,
        limit: int | None = None,
        stream: str | None = None,
        from_version: int = 1,
    ) -> AsyncIterator[Sequence[Foldable]]:
        """:meth:`read_batches` as a fold reads it: the same events, batches and errors.

        A backend may yield :class:`~loopd_es.events.envelope.Recorded` rows (no ids, no causal links)
        where they are cheaper to read; this default yields whole envelopes.
        """
        return self.read_batches(
            from_position=from_position, limit=limit, stream=stream, from_version=from_version
        )

    async def read_stream_rows(
        self, stream: str, *, from_version: int = 1, until_position: int | None = None
    ) -> AsyncIterator[StreamRows]:
        """One stream's events from ``from_version`` on, up to global position ``until_position``, as a fold of
        that one stream reads them (:class:`~loopd_es.events.envelope.StreamRows`), a batch at a time.

        A backend may fetch only those columns and the last row's place; this default takes them from
        :meth:`read_recorded`.

        :raises CorruptLogError: as for :meth:`read_batches`, and when the stream's versions have a gap.
        """
        until = MAX_POSITION if until_position is None else until_position
        expected = max(from_version, 1)  # the version the next row must have
        async for batch in self.read_recorded(stream=stream, from_version=from_version):
            ended = batch[-1].position > until
            if ended:  # a stream's positions rise with its versions: what the cut keeps is a head
                batch = [e for e in batch if e.position <= until]
                if not batch:
                    return
            last = batch[-1]
            check_contiguous(self.url, stream, expected, last.version, len(batch))
            rows = [(e.type, e.schema_version, bytes(e.data)) for e in batch]
            yield StreamRows(expected, rows, last.position, last.recorded_at)
            expected = last.version + 1
            if ended:
                return

    async def read_log_rows(
        self, *, rows_prefix: str, until_position: int | None = None
    ) -> AsyncIterator[LogRows]:
        """Every event up to global position ``until_position`` as a whole-log fold reads it
        (:class:`~loopd_es.events.envelope.LogRows`), a batch at a time: the streams whose names start with
        ``rows_prefix`` (and are longer) as rows, the others as recorded events; then, after the last event, a
        batch that gives each row stream's last place.

        A backend may fetch the rows' four columns and look up the places at the end; this default yields
        every event as recorded (no rows, so no places).

        :raises CorruptLogError: as for :meth:`read_batches`.
        """
        until = MAX_POSITION if until_position is None else until_position
        async for batch in self.read_recorded(limit=until_position):
            if batch[-1].position > until:
                kept = [e for e in batch if e.position <= until]
                if kept:
                    yield LogRows([], kept)
                return
            yield LogRows([], batch)

    @abc.abstractmethod
    async def head(self) -> int:
        """The position of the last recorded event, 0 for an empty log."""

    @abc.abstractmethod
    async def stream_version(self, stream: str) -> int:
        """The version of the last event of ``stream``, 0 when it has none."""

    @abc.abstractmethod
    async def streams(self) -> list[str]:
        """Every stream with at least one event, sorted by name."""

    @abc.abstractmethod
    async def verify(self, *, repair: bool = False) -> VerifyReport:
        """Check every invariant of the whole log: gapless positions, contiguous versions, unique ids,
        decodable records, no torn tail. With ``repair``, cut a torn tail or a crashed writer's
        unacknowledged write, never an acknowledged event.
        """

    @abc.abstractmethod
    async def import_envelopes(self, batches: AsyncIterator[list[Envelope]]) -> int:
        """Copy a whole log into this empty one verbatim (positions, ids, timestamps, payload bytes).

        All or nothing: on any error the target is left empty. Returns the number of events copied.

        :raises UsageError: when this log is not empty.
        :raises CorruptLogError: when the source breaks the log's invariants (gaps, version jumps).
        """

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Flush what the durability mode allows to be pending and release files and threads."""

    # -- conveniences shared by every backend -----------------------------------------------------

    async def read_all(
        self,
        from_position: int = 1,
        limit: int | None = None,
        *,
        types: Sequence[str] | None = None,
        stream_prefix: str | None = None,
    ) -> AsyncIterator[Envelope]:
        """Every event from ``from_position`` on, in global order, streamed with bounded memory.

        ``types`` keeps only events of those types and ``stream_prefix`` only streams whose name starts
        with it; ``limit`` counts the events kept. Payloads of skipped events are never decoded.
        """
        async for batch in self.read_filtered(
            from_position=from_position, limit=limit, types=types, stream_prefix=stream_prefix
        ):
            for envelope in batch:
                yield envelope

    async def read_filtered(
        self,
        *,
        from_position: int = 1,
        limit: int | None = None,
        types: Sequence[str] | None = None,
        stream_prefix: str | None = None,
    ) -> AsyncIterator[list[Envelope]]:
        """:meth:`read_all`'s batches; backends that can filter in storage override this."""
        if types is None and not stream_prefix:
            async for batch in self.read_batches(from_position=from_position, limit=limit):
                yield batch
            return
        wanted = None if types is None else frozenset(types)
        remaining = -1 if limit is None else limit
        if remaining == 0:
            return
        async for batch in self.read_batches(from_position=from_position):
            kept = [
                e
                for e in batch
                if (wanted is None or e.type in wanted)
                and (not stream_prefix or e.stream.startswith(stream_prefix))
            ]
            if remaining >= 0:
                kept = kept[:remaining]
                remaining -= len(kept)
            if kept:
                yield kept
            if remaining == 0:
                return

    async def read_backwards(
        self, *, stream: str | None = None, start: int | None = None, limit: int | None = None
    ) -> AsyncIterator[list[Envelope]]:
        """Events newest first, from ``start`` (a position, or a version with ``stream``; default: the last).

        Costs what it returns: each batch is one bounded forward read of the window before the last one.

        :raises StreamNotFoundError: when ``stream`` has no events.
        """
        if stream is not None:
            top = await self.stream_version(stream)
            if top == 0:
                raise StreamNotFoundError(stream)
        else:
            top = await self.head()
        end = top if start is None else min(start, top)
        remaining = -1 if limit is None else limit
        while end >= 1 and remaining != 0:
            size = READ_BATCH if remaining < 0 else min(READ_BATCH, remaining)
            first = max(1, end - size + 1)
            window: list[Envelope] = []
            async for batch in self.read_batches(
                from_position=first, from_version=first, stream=stream, limit=end - first + 1
            ):
                window.extend(batch)
            if not window:
                return
            window.reverse()
            yield window
            end = first - 1
            if remaining > 0:
                remaining -= len(window)

    async def wait_for(self, position: int, timeout: float | None = None) -> bool:  # noqa: ASYNC109 - the API
        """Wait until the log holds ``position`` (by any writer); False when ``timeout`` seconds pass first.

        An append through this store wakes the waiter at once; appends by other processes are noticed
        within 50 ms (the head is polled, at growing intervals from 1 ms).
        """
        import anyio  # here, not at module level: `import loopd_es` stays cheap for CLI start-up

        deadline = math.inf if timeout is None else time.monotonic() + timeout
        poll = 0.001
        while True:
            signal = self._commit_signal()
            if await self.head() >= position:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            with anyio.move_on_after(min(poll, left)):
                if signal is None:
                    await anyio.sleep(poll)
                else:
                    await signal.wait()
            poll = min(poll * 2, 0.05)

    def _commit_signal(self) -> anyio.Event | None:
        """An event set when this store next commits, or None when the backend has no such signal."""
        group = getattr(self, "_group", None)
        return None if group is None else group.committed()

    async def read_stream(
        self, stream: str, from_version: int = 1, limit: int | None = None
    ) -> AsyncIterator[Envelope]:
        """One stream's events from ``from_version`` on, in version order.

        :raises StreamNotFoundError: when the stream has no events.
        """
        if await self.stream_version(stream) == 0:
            raise StreamNotFoundError(stream)
        async for batch in self.read_batches(stream=stream, from_version=from_version, limit=limit):
            for envelope in batch:
                yield envelope

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


@functools.cache
def _append_tools() -> tuple[type[Request], Callable[[Sequence[NewEvent]], Sequence[NewEvent]]]:
    """What an append needs, imported on the first append rather than with this module (anyio comes with
    the group commit, and a one-shot query never appends); cached, as an import in the append itself would
    cost it about 1.5 us each time."""
    from .group_commit import Request
    from .validation import check_new_events

    return Request, check_new_events


def _checked_fences(fences: Sequence[Fence]) -> tuple[Fence, ...]:
    out = tuple(Fence(*fence) for fence in fences)
    for fence in out:
        check_key(fence.key)
        if not isinstance(fence.token, int) or isinstance(fence.token, bool) or fence.token < 1:
            raise UsageError(
                f"fence on {fence.key!r}: the token must be a positive integer, not {fence.token!r}"
            )
    return out


async def stream_rows_batches(
    read: Callable[[int], Awaitable[StreamRows | None]], from_version: int
) -> AsyncIterator[StreamRows]:
    """A backend's :meth:`LogStore.read_stream_rows`: ``read(after)`` (a batch of up to :data:`READ_BATCH`
    events after version ``after``, or None) until a batch comes short."""
    after = max(from_version, 1) - 1
    while (batch := await read(after)) is not None:
        yield batch
        if len(batch.rows) < READ_BATCH:
            return
        after = batch.last_version


def prefix_bounds(prefix: str) -> tuple[str, str]:
    """The names strictly between these two are exactly those that start with ``prefix`` and are longer.

    :raises ValueError: for an empty prefix, or one whose last character has no successor.
    """
    if not prefix or prefix[-1] == "\U0010ffff":
        raise ValueError(f"a stream prefix must be non-empty and end below U+10FFFF, got {prefix!r}")
    return prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)


MAX_POSITION: Final = (1 << 63) - 1
"""The largest position a log can hold (SQLite's and PostgreSQL's 64-bit integers): "no cut"."""


def check_expected_version(stream: str, expected: ExpectedVersion, actual: int) -> None:
    """Refuse an append whose expectation the stream's ``actual`` version does not meet.

    :raises WrongExpectedVersionError: on a mismatch.
    """
    if expected == actual or expected == ANY:  # the common cases first: this runs for every append
        return
    if expected == NO_STREAM:
        ok = actual == 0
    elif expected == EXISTS:
        ok = actual > 0
    else:
        ok = False
    if not ok:
        from ..errors import WrongExpectedVersionError

        raise WrongExpectedVersionError(stream, expected, actual)


def parse_expected_version(text: str | int) -> ExpectedVersion:
    """Turn a CLI or API value into an expected version.

    :raises UsageError: for anything but a non-negative integer, ``no_stream``, ``exists`` or ``any``.
    """
    if isinstance(text, bool) or not isinstance(text, int | str):
        raise UsageError(
            f"invalid expected version {text!r}: use a version number, 'no_stream', 'exists' or 'any'"
        )
    if isinstance(text, int):
        if text < 0:
            raise UsageError(f"expected version must be >= 0, got {text}")
        return text
    value = str(text).strip()
    if value in (NO_STREAM, EXISTS, ANY):
        return value  # type: ignore[return-value]
    if value.isascii() and value.isdigit() and len(value) < 19:
        return int(value)
    raise UsageError(
        f"invalid expected version {text!r}: use a version number (0 for a new stream), "
        "'no_stream', 'exists' or 'any'"
    )


def check_stream_name(stream: str) -> None:
    """Stream names are non-empty printable text without newlines, at most 200 characters.

    :raises UsageError: otherwise.
    """
    if not stream or len(stream) > 200 or not stream.isprintable():
        raise UsageError(f"invalid stream name {stream!r}: use 1 to 200 printable characters, e.g. 'goal-42'")
