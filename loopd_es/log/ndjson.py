"""The NDJSON backend: one envelope per line in a plain file that any tool can read.

Writes. Appends from one process are gathered into one group commit (one ``write``, one ``fdatasync``)
by whichever task arrives first; that task takes the cross-process ``flock``, catches up on what other
processes appended, cuts a crashed writer's unfinished write, checks ids and versions, writes, syncs and
only then acknowledges. The sync runs on the event-loop thread on purpose: on this machine class a
thread hand-off costs about half an fsync, and group commit means one fsync per batch of writers.

Reads never take the lock; they stop before a write in flight (see :mod:`.ndjson_files`) and before an
unfinished write (see :mod:`.ndjson_scan`), so a reader never sees an event that could still disappear.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Final

import anyio
import anyio.lowlevel

from ..errors import CorruptLogError, StoreUnavailableError, StreamNotFoundError, UsageError
from ..events.envelope import ANY, Envelope, ExpectedVersion, NewEvent
from .base import (
    READ_BATCH,
    LogStore,
    SequenceChecker,
    VerifyReport,
    check_stream_name,
    parse_expected_version,
)
from .group_commit import Request, prepare_path
from .ndjson_files import event_id_key
from .ndjson_foreign import check_is_log
from .ndjson_scan import IndexMismatch, Span, read_spans, scan
from .ndjson_state import NdjsonState, Rec, log
from .ndjson_write import stage_group, stage_import
from .validation import check_new_events

DURABILITY: Final = ("always", "batch", "none")
_BATCH_SYNC_SECONDS: Final = 0.05


class NdjsonLog(NdjsonState, LogStore):
    """An append-only log in one NDJSON file, safe for many processes appending at once."""

    def __init__(self, path: Path, durability: str, lock_timeout: float) -> None:
        super().__init__(path, durability, lock_timeout)
        self._unsynced_since: float | None = None

    @classmethod
    async def open(
        cls, path: Path, *, durability: str = "always", create: bool = True, lock_timeout: float = 30.0
    ) -> NdjsonLog:
        """Open the log at ``path``, validating (or rebuilding) its index.

        :raises UsageError: for an unknown durability mode.
        :raises StoreUnavailableError: when the file cannot be opened (or does not exist and not ``create``),
            or is not a loopd-es log (nothing is then created or changed).
        """
        if durability not in DURABILITY:
            raise UsageError(f"unknown durability {durability!r}: use one of {', '.join(DURABILITY)}")
        prepare_path(path, create=create)
        check_is_log(path)
        store = cls(path, durability, lock_timeout)
        try:
            store._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            store._close_files()
            raise StoreUnavailableError(f"cannot open {path}: {e.strerror}; check --store and permissions") from e
        try:
            store._load_index()
            try:
                store._refresh()
            except CorruptLogError:
                pass  # every read and append raises it again; ``verify`` still lists every problem
        except BaseException:
            store._close_files()
            raise
        return store

    # -- reading ------------------------------------------------------------------------------------

    async def read_batches(
        self,
        *,
        from_position: int = 1,
        limit: int | None = None,
        stream: str | None = None,
        from_version: int = 1,
    ) -> AsyncIterator[list[Envelope]]:
        self._check_usable()
        self._refresh()
        remaining = limit if limit is not None else -1
        if remaining == 0:
            return
        if stream is not None:
            async for stream_batch in self._read_stream_batches(stream, from_version, remaining):
                yield stream_batch
            return
        position = max(from_position, 1)
        if position > self._head:
            return
        offset = self._offset_of(position)
        # read only what the limit asks for: up to the start of the first event past it
        stop = self._end if remaining < 0 or position + remaining > self._head else self._offset_of(position + remaining)
        batch: list[Envelope] = []
        for _lines, envs in scan(self.path, self._fd, offset, stop, first_position=position):
            for env in envs:
                batch.append(env)
                if len(batch) == READ_BATCH:
                    yield batch
                    batch = []
            await anyio.lowlevel.checkpoint()
        if batch:
            yield batch

    def _offset_of(self, position: int) -> int:
        if position <= self._indexed:
            return self._index.record(position)[0]
        return self._tail[position - self._indexed - 1].offset

    async def read_stream(
        self, stream: str, from_version: int = 1, limit: int | None = None
    ) -> AsyncIterator[Envelope]:
        self._check_usable()
        self._refresh()
        spans = self._stream_spans(stream, 1)
        if not spans:
            raise StreamNotFoundError(stream)
        async for batch in self._read_stream_batches(stream, from_version, -1 if limit is None else limit, spans):
            for envelope in batch:
                yield envelope

    async def _read_stream_batches(
        self, stream: str, from_version: int, remaining: int, spans: list[Span] | None = None
    ) -> AsyncIterator[list[Envelope]]:
        if spans is None:
            spans = self._stream_spans(stream, max(from_version, 1))
        elif from_version > 1:
            spans = spans[from_version - 1 :]  # versions are contiguous from 1
        i = 0
        rebuilt = False
        while i < len(spans):
            chunk = spans[i : i + READ_BATCH]
            if remaining >= 0:
                chunk = chunk[:remaining]
            try:
                envs = read_spans(self.path, self._fd, chunk)
            except IndexMismatch as e:  # a wrong index record: rebuild (or read from the log alone), go on
                if rebuilt:
                    raise self._corrupt(None, str(e)) from e
                rebuilt = True
                self._index_broken(str(e))
                self._refresh()
                spans = spans[:i] + self._stream_spans(stream, max(from_version, 1) + i)
                continue
            for env in envs:
                if env.stream != stream:
                    raise self._corrupt(env.position, f"the index points at stream {env.stream!r}, not {stream!r}")
            yield envs
            i += len(chunk)
            if remaining >= 0:
                remaining -= len(envs)
                if remaining <= 0:
                    return
            await anyio.lowlevel.checkpoint()

    def _stream_spans(self, stream: str, from_version: int) -> list[Span]:
        """(offset, length, checksum, position) of the stream's events from ``from_version``: index scan
        plus the tail."""
        spans: list[Span] = []
        number = self._names.number(stream)
        if number is not None:
            for chunk, base, position in self._index.matches(2, number, self._indexed):
                if chunk[base + 3] >= from_version:
                    spans.append((chunk[base], chunk[base + 1], chunk[base + 5] & 0xFFFFFFFF, position))
        first_tail = self._indexed + 1
        spans.extend(
            (rec.offset, rec.length, rec.crc, first_tail + i)
            for i, rec in enumerate(self._tail)
            if rec.stream == stream and rec.version >= from_version
        )
        return spans

    def _corrupt(self, position: int | None, why: str) -> Exception:
        from ..errors import CorruptLogError

        return CorruptLogError(str(self.path), position, why)

    async def head(self) -> int:
        self._check_usable()
        self._refresh()
        return self._head

    async def stream_version(self, stream: str) -> int:
        self._check_usable()
        self._refresh()
        if self._versions is not None:
            return self._versions.get(stream, 0)
        for rec in reversed(self._tail):
            if rec.stream == stream:
                return rec.version
        spans = self._stream_spans(stream, 1)
        if not spans:
            return 0
        return read_spans(self.path, self._fd, spans[-1:])[0].version

    async def streams(self) -> list[str]:
        self._check_usable()
        self._refresh()
        self._ensure_writer_state()
        assert self._versions is not None
        return sorted(name for name, version in self._versions.items() if version > 0)

    # -- writing ------------------------------------------------------------------------------------

    async def append(
        self, stream: str, events: Sequence[NewEvent], expected_version: ExpectedVersion = ANY
    ) -> list[Envelope]:
        self._check_usable()
        check_stream_name(stream)
        expected_version = parse_expected_version(expected_version)
        events = check_new_events(events)
        if not events:
            return []
        return await self._group.submit(Request(stream, events, expected_version))

    async def _submit(self, request: Request) -> list[Envelope]:
        self._check_usable()
        return await self._group.submit(request)

    async def _commit(self, group: list[Request]) -> None:
        if not self._lock.try_acquire():
            await self._lock.acquire()
        try:
            self._sync_locked()
            self._write_group(group)
        except OSError as e:
            raise StoreUnavailableError(f"cannot write {self.path}: {e.strerror}; nothing was appended") from e
        finally:
            self._lock.release()

    def _write_group(self, group: list[Request]) -> None:
        assert self._versions is not None and self._keys is not None
        staged = stage_group(
            group, self._head, self._end, self._chain, self._versions, self._names, self._find_retry
        )
        if not staged.accepted:
            return
        self._write_durably(staged.data)
        # from here on the events are appended: whatever happens to the index, the callers are told so
        try:
            self._index.write_at(staged.records, self._head)  # _sync_locked left the index at _head records
            self._indexed, self._chain = staged.head, staged.chain
        except OSError as e:
            log.warning("%s: cannot write the index (%s); the next writer brings it up to date", self.path, e)
            names = self._names.names
            self._tail.extend(Rec(o, n, names[s], v, k, c) for o, n, s, v, k, c in staged.fields)
        self._head = staged.head
        self._end = staged.end
        for request, envelopes, keys in staged.accepted:
            request.result = envelopes
            if len(request.parts) == 1:
                self._versions[request.stream] = envelopes[-1].version
            else:
                self._versions.update((env.stream, env.version) for env in envelopes)
            self._keys.update(keys)

    def _write_durably(self, data: bytes) -> None:
        start = self._end
        self._lock.set_intent(start, start + len(data))
        try:
            written = 0
            while written < len(data):
                written += os.pwrite(self._fd, data[written:], start + written)
            self._sync_for_durability()
        except OSError:
            try:
                os.ftruncate(self._fd, start)
            finally:
                self._lock.clear_intent()
            raise
        self._lock.clear_intent()

    def _sync_for_durability(self) -> None:
        if self.durability == "always":
            os.fdatasync(self._fd)
        elif self.durability == "batch":
            now = time.monotonic()
            if self._unsynced_since is None:
                self._unsynced_since = now
            elif now - self._unsynced_since >= _BATCH_SYNC_SECONDS:
                os.fdatasync(self._fd)
                self._unsynced_since = None

    def _find_retry(
        self, request: Request, keys: list[int], staged: dict[int, Envelope]
    ) -> list[Envelope] | None:
        """The original envelopes when the request is an exact retry; None when all ids are new."""
        assert self._keys is not None
        known = self._keys
        if known.isdisjoint(keys) and (not staged or staged.keys().isdisjoint(keys)):
            return None
        originals: list[Envelope | None] = []
        for new, key in zip(request.all_events, keys, strict=True):
            env = staged.get(key)
            if env is not None and env.event_id != new.event_id:
                env = None
            if env is None and key in known:
                env = self._lookup_event(new.event_id)
            originals.append(env)
        return request.retry_result(originals)

    def _lookup_event(self, event_id: str) -> Envelope | None:
        key = event_id_key(event_id)
        first_tail = self._indexed + 1
        for i, rec in enumerate(self._tail):
            if rec.key == key:
                env = read_spans(self.path, self._fd, [(rec.offset, rec.length, rec.crc, first_tail + i)])[0]
                if env.event_id == event_id:
                    return env
        for chunk, base, position in self._index.matches(4, key, self._indexed):
            span = (chunk[base], chunk[base + 1], chunk[base + 5] & 0xFFFFFFFF, position)
            env = read_spans(self.path, self._fd, [span])[0]
            if env.event_id == event_id:
                return env
        return None

    async def import_envelopes(self, batches: AsyncIterator[list[Envelope]]) -> int:
        self._check_usable()
        await self._lock.acquire()
        try:
            self._sync_locked()
            if self._head or os.fstat(self._fd).st_size:
                raise UsageError(f"{self.url} is not empty ({self._head} events); import only into a new log")
            checker = SequenceChecker(self.url)
            offset = 0
            chain = self._chain
            try:
                async for batch in batches:
                    buffer, records, chain = stage_import(batch, checker, self._names, offset, chain)
                    os.pwrite(self._fd, buffer, offset)
                    self._index.append(records, self._index.count())
                    offset += len(buffer)
                os.fsync(self._fd)
            except BaseException:
                os.ftruncate(self._fd, 0)
                self._index.reset()
                self._names.reset()
                raise
            self._end, self._head, self._chain = offset, checker.position, chain
            self._indexed, self._tail = self._head, []
            self._versions, self._keys = None, None
            self._ensure_writer_state()
            return checker.position
        finally:
            self._lock.release()

    # -- verification and closing -------------------------------------------------------------------

    async def verify(self, *, repair: bool = False) -> VerifyReport:
        from .ndjson_verify import changed_lines, verify_ndjson

        self._check_open()
        if repair:
            await self._lock.acquire()
            try:
                changed = changed_lines(self._verify_now(True, verify_ndjson))
                if self.index_mismatch is not None or changed:
                    self.repairs.append(
                        f"repaired {self.path}: accepted the log as it is ({changed} changed lines): "
                        "rebuilt the index and its checksums from the log"
                    )
                    self._rebuild_index()
                self._sync_locked()
            finally:
                self._lock.release()
        quiet = self._lock.try_acquire()  # no writer in flight: an intent left behind is a dead writer's
        try:
            report = self._verify_now(quiet, verify_ndjson)
        finally:
            if quiet:
                self._lock.release()
        report.repaired.extend(self.repairs)
        return report

    def _verify_now(self, quiet: bool, check: Callable[..., VerifyReport]) -> VerifyReport:
        return check(self.path, self._fd, os.fstat(self._fd).st_size, self._lock.intent(), quiet, self._index)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self.durability == "batch" and self._unsynced_since is not None:
                os.fdatasync(self._fd)
        finally:
            self._close_files()
