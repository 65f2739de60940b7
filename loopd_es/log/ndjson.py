"""The NDJSON backend: one envelope per line in a plain file that any tool can read.

Writes. Appends from one process are gathered into one group commit (one ``write``, one ``fdatasync``)
by whichever task arrives first; that task takes the cross-process ``flock``, catches up on what other
processes appended, repairs a crashed writer's partial write, checks ids and versions, writes, syncs and
only then acknowledges. The sync runs on the event-loop thread on purpose: on this machine class a
thread hand-off costs about half an fsync, and group commit means one fsync per batch of writers.

Reads never take the lock; they stop before a write in flight (see :mod:`.ndjson_files`) and before an
incomplete last line, so a reader never sees an event that could still disappear.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Final

import anyio
import anyio.lowlevel
import msgspec

from ..errors import (
    CorruptLogError,
    StorageError,
    StoreUnavailableError,
    StreamNotFoundError,
    UsageError,
)
from ..events.envelope import (
    ANY,
    ENVELOPE_DECODER,
    Envelope,
    ExpectedVersion,
    NewEvent,
)
from .base import (
    READ_BATCH,
    LogStore,
    SequenceChecker,
    VerifyReport,
    check_stream_name,
    parse_expected_version,
)
from .group_commit import GroupCommitter, Request, prepare_path
from .ndjson_files import RECORD, RECORD_FIELDS, IndexFile, LockFile, StreamNames, event_id_key
from .ndjson_scan import read_spans, scan
from .ndjson_write import stage_group, stage_import
from .validation import check_new_events, resolve_retry

log = logging.getLogger("loopd_es.log")

DURABILITY: Final = ("always", "batch", "none")
_CHUNK: Final = 1 << 20
_BATCH_SYNC_SECONDS: Final = 0.05


class _Rec(msgspec.Struct, array_like=True):
    """Where one event lives, for events not (yet) in the index file."""

    offset: int
    length: int
    stream: str
    version: int
    key: int


class NdjsonLog(LogStore):
    """An append-only log in one NDJSON file, safe for many processes appending at once."""

    def __init__(self, path: Path, durability: str, lock_timeout: float) -> None:
        self.path = path
        self.url = f"ndjson:{path}"
        self.durability = durability
        self.repairs: list[str] = []
        self.torn_tail: tuple[int, int] | None = None
        """(byte offset, size) of an incomplete last write readers skip, until a writer or ``verify --repair``
        cuts it."""
        self._fd = -1
        self._lock = LockFile(path.with_name(path.name + ".lock"), lock_timeout)
        self._index = IndexFile(path.with_name(path.name + ".idx"))
        self._names = StreamNames(path.with_name(path.name + ".streams"))
        self._end = 0  # bytes of complete, committed events this instance has seen
        self._head = 0
        self._indexed = 0  # positions 1.._indexed are in the index file
        self._tail: list[_Rec] = []  # positions _indexed+1.._head
        self._versions: dict[str, int] | None = None  # writer state, built on the first append
        self._keys: set[int] | None = None
        self._group = GroupCommitter(self._commit)
        self._unsynced_since: float | None = None
        self._closed = False
        self._index_suspect = False

    # -- opening ------------------------------------------------------------------------------------

    @classmethod
    async def open(
        cls, path: Path, *, durability: str = "always", create: bool = True, lock_timeout: float = 30.0
    ) -> NdjsonLog:
        """Open the log at ``path``, validating (or rebuilding) its index.

        :raises UsageError: for an unknown durability mode.
        :raises StoreUnavailableError: when the file cannot be opened (or does not exist and not ``create``).
        """
        if durability not in DURABILITY:
            raise UsageError(f"unknown durability {durability!r}: use one of {', '.join(DURABILITY)}")
        prepare_path(path, create=create)
        store = cls(path, durability, lock_timeout)
        try:
            store._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            store._close_files()
            raise StoreUnavailableError(f"cannot open {path}: {e.strerror}; check --store and permissions") from e
        try:
            store._load_index()
            store._refresh()
        except BaseException:
            store._close_files()
            raise
        return store

    def _load_index(self) -> None:
        """Trust the index only after checking its first and last records against the log."""
        self._names.refresh()
        count = self._index.count()
        if count and not (self._record_matches(1) and self._record_matches(count)):
            log.warning("%s: index does not match the log; rebuilding it from the log", self.path)
            if self._lock.try_acquire():
                try:
                    count = self._rebuild_index()
                finally:
                    self._lock.release()
            else:  # a writer is busy: read from the log alone, and rebuild under the lock on our first write
                self._index_suspect = True
                count = 0
        self._indexed = self._head = count
        if count:
            offset, length, *_ = self._index.record(count)
            self._end = offset + length

    def _record_matches(self, position: int) -> bool:
        offset, length, number, version, key = self._index.record(position)
        if number >= len(self._names.names) or offset + length > os.fstat(self._fd).st_size:
            return False
        line = os.pread(self._fd, length, offset)
        try:
            env = ENVELOPE_DECODER.decode(line)
        except msgspec.DecodeError:
            return False
        return (
            line.endswith(b"\n")
            and env.position == position
            and env.version == version
            and env.stream == self._names.names[number]
            and event_id_key(env.event_id) == key
        )

    def _rebuild_index(self) -> int:
        """Rebuild the index files from the log (a full scan); returns the positions indexed."""
        self._index.reset()
        self._names.reset()
        records = bytearray()
        position = 0
        offset = 0
        for lines, envs in scan(self.path, self._fd, 0, self._visible_end(), 1):
            for line, env in zip(lines, envs, strict=True):
                number = self._names.number(env.stream)
                if number is None:
                    number = self._names.add(env.stream)
                records += RECORD.pack(offset, len(line), number, env.version, event_id_key(env.event_id))
                offset += len(line)
                position += 1
        self._index.append(bytes(records), 0)
        return position

    # -- reading ------------------------------------------------------------------------------------

    def _visible_end(self) -> int:
        """The end of what readers may see: not past a write in flight."""
        size = os.fstat(self._fd).st_size
        intent = self._lock.intent()
        if intent is not None and intent[0] < size and not self._lock.held:
            return intent[0]
        return size

    def _refresh(self) -> None:
        """Catch up (in memory) on complete events appended since we last looked."""
        visible = self._visible_end()
        if visible < self._end:
            raise CorruptLogError(
                str(self.path), None, f"the log shrank from {self._end} to {visible} bytes behind our back"
            )
        if visible > self._end:
            self._catch_up(visible)
        # what is left past the last complete event is a torn write (an in-flight one is not visible)
        self.torn_tail = (self._end, visible - self._end) if visible > self._end else None

    def _catch_up(self, visible: int) -> None:
        offset = self._end
        for lines, envs in scan(self.path, self._fd, offset, visible, first_position=self._head + 1):
            for line, env in zip(lines, envs, strict=True):
                key = event_id_key(env.event_id)
                self._tail.append(_Rec(offset, len(line), env.stream, env.version, key))
                offset += len(line)
                self._head = env.position
                if self._versions is not None:
                    self._versions[env.stream] = env.version
                if self._keys is not None:
                    self._keys.add(key)
        self._end = offset

    async def read_batches(
        self,
        *,
        from_position: int = 1,
        limit: int | None = None,
        stream: str | None = None,
        from_version: int = 1,
    ) -> AsyncIterator[list[Envelope]]:
        self._check_open()
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
        stop = self._end
        batch: list[Envelope] = []
        for _lines, envs in scan(self.path, self._fd, offset, stop, first_position=position):
            for env in envs:
                batch.append(env)
                remaining -= 1
                if remaining == 0:
                    yield batch
                    return
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
        self._check_open()
        self._refresh()
        spans = self._stream_spans(stream, 1)
        if not spans:
            raise StreamNotFoundError(stream)
        async for batch in self._read_stream_batches(stream, from_version, -1 if limit is None else limit, spans):
            for envelope in batch:
                yield envelope

    async def _read_stream_batches(
        self, stream: str, from_version: int, remaining: int, spans: list[tuple[int, int]] | None = None
    ) -> AsyncIterator[list[Envelope]]:
        if spans is None:
            spans = self._stream_spans(stream, max(from_version, 1))
        elif from_version > 1:
            spans = spans[from_version - 1 :]  # versions are contiguous from 1
        for i in range(0, len(spans), READ_BATCH):
            chunk = spans[i : i + READ_BATCH]
            if remaining >= 0:
                chunk = chunk[:remaining]
            envs = read_spans(self.path, self._fd, chunk)
            for env in envs:
                if env.stream != stream:
                    raise CorruptLogError(
                        str(self.path), env.position, f"the index points at stream {env.stream!r}, not {stream!r}"
                    )
            yield envs
            if remaining >= 0:
                remaining -= len(envs)
                if remaining <= 0:
                    return
            await anyio.lowlevel.checkpoint()

    def _stream_spans(self, stream: str, from_version: int) -> list[tuple[int, int]]:
        """(offset, length) of the stream's events from ``from_version``: index scan plus the tail."""
        spans: list[tuple[int, int]] = []
        number = self._names.number(stream)
        if number is not None:
            for chunk, base in self._index.matches(2, number, self._indexed):
                if chunk[base + 3] >= from_version:
                    spans.append((chunk[base], chunk[base + 1]))
        spans.extend(
            (rec.offset, rec.length) for rec in self._tail if rec.stream == stream and rec.version >= from_version
        )
        return spans

    async def head(self) -> int:
        self._check_open()
        self._refresh()
        return self._head

    async def stream_version(self, stream: str) -> int:
        self._check_open()
        self._refresh()
        if self._versions is not None:
            return self._versions.get(stream, 0)
        for rec in reversed(self._tail):
            if rec.stream == stream:
                return rec.version
        spans = self._stream_spans(stream, 1)
        if not spans:
            return 0
        offset, length = spans[-1]
        return ENVELOPE_DECODER.decode(os.pread(self._fd, length, offset)).version

    async def streams(self) -> list[str]:
        self._check_open()
        self._refresh()
        self._ensure_writer_state()
        assert self._versions is not None
        return sorted(name for name, version in self._versions.items() if version > 0)

    # -- writing ------------------------------------------------------------------------------------

    async def append(
        self, stream: str, events: Sequence[NewEvent], expected_version: ExpectedVersion = ANY
    ) -> list[Envelope]:
        self._check_open()
        check_stream_name(stream)
        expected_version = parse_expected_version(expected_version)
        events = check_new_events(events)
        if not events:
            return []
        return await self._group.submit(Request(stream, events, expected_version))

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

    def _sync_locked(self) -> None:
        """Under the lock: repair a crashed writer's leftovers, catch up, bring the index up to date."""
        if self._index_suspect:
            self._index_suspect = False
            self._rebuild_index()
        size = os.fstat(self._fd).st_size
        if size != self._end:
            intent = self._lock.intent()
            if intent is not None and self._end <= intent[0] < size:
                self._truncate(intent[0], size, "an unacknowledged write of a crashed writer")
                self._lock.clear_intent()
                size = intent[0]
            if size < self._end:
                raise CorruptLogError(
                    str(self.path), None, f"the log shrank from {self._end} to {size} bytes behind our back"
                )
            self._catch_up(size)
            if self._end < size:
                self._truncate(self._end, size, "a torn last line (an incomplete write)")
            self._flush_tail()
        elif self._tail:
            self._flush_tail()
        self._ensure_writer_state()

    def _truncate(self, offset: int, size: int, what: str) -> None:
        os.ftruncate(self._fd, offset)
        os.fsync(self._fd)
        message = f"repaired {self.path}: dropped {size - offset} bytes at byte offset {offset}: {what}"
        log.warning("%s", message)
        self.repairs.append(message)

    def _flush_tail(self) -> None:
        """Write index records for events we know of that the index file lacks."""
        on_disk = self._index.count()
        if on_disk >= self._head:
            self._indexed, self._tail = self._head, []
            return
        if on_disk < self._indexed:
            self._indexed = self._rebuild_index()
            self._tail = []
            return
        records = bytearray()
        for rec in self._tail[on_disk - self._indexed :]:
            number = self._names.number(rec.stream)
            if number is None:
                number = self._names.add(rec.stream)
            records += RECORD.pack(rec.offset, rec.length, number, rec.version, rec.key)
        self._index.append(bytes(records), on_disk)
        self._indexed, self._tail = self._head, []

    def _ensure_writer_state(self) -> None:
        """Stream versions and event-id keys of the whole log, built once from the index."""
        if self._versions is not None:
            return
        versions: dict[int, int] = {}
        keys: set[int] = set()
        for chunk in self._index.chunks(0, self._indexed):
            versions.update(zip(chunk[2::RECORD_FIELDS], chunk[3::RECORD_FIELDS], strict=True))
            keys.update(chunk[4::RECORD_FIELDS])
        self._names.refresh()
        by_name = {self._names.names[number]: version for number, version in versions.items()}
        for rec in self._tail:
            by_name[rec.stream] = rec.version
            keys.add(rec.key)
        self._versions, self._keys = by_name, keys

    def _write_group(self, group: list[Request]) -> None:
        assert self._versions is not None and self._keys is not None
        staged = stage_group(group, self._head, self._end, self._versions, self._names, self._find_retry)
        if not staged.accepted:
            return
        self._write_durably(staged.data)
        self._index.write_at(staged.records, self._head)  # _sync_locked left the index at _head records
        self._head = self._indexed = staged.head
        self._end = staged.end
        for request, envelopes, keys in staged.accepted:
            request.result = envelopes
            self._versions[request.stream] = envelopes[-1].version
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
        for new, key in zip(request.events, keys, strict=True):
            env = staged.get(key)
            if env is not None and env.event_id != new.event_id:
                env = None
            if env is None and key in known:
                env = self._lookup_event(new.event_id)
            originals.append(env)
        return resolve_retry(request.stream, request.events, originals)

    def _lookup_event(self, event_id: str) -> Envelope | None:
        key = event_id_key(event_id)
        for rec in self._tail:
            if rec.key == key:
                env = ENVELOPE_DECODER.decode(os.pread(self._fd, rec.length, rec.offset))
                if env.event_id == event_id:
                    return env
        for chunk, base in self._index.matches(4, key, self._indexed):
            env = ENVELOPE_DECODER.decode(os.pread(self._fd, chunk[base + 1], chunk[base]))
            if env.event_id == event_id:
                return env
        return None

    async def import_envelopes(self, batches: AsyncIterator[list[Envelope]]) -> int:
        self._check_open()
        await self._lock.acquire()
        try:
            self._sync_locked()
            if self._head or os.fstat(self._fd).st_size:
                raise UsageError(f"{self.url} is not empty ({self._head} events); import only into a new log")
            checker = SequenceChecker(self.url)
            offset = 0
            try:
                async for batch in batches:
                    buffer, records = stage_import(batch, checker, self._names, offset)
                    os.pwrite(self._fd, buffer, offset)
                    self._index.append(records, self._index.count())
                    offset += len(buffer)
                os.fsync(self._fd)
            except BaseException:
                os.ftruncate(self._fd, 0)
                self._index.reset()
                self._names.reset()
                raise
            self._end, self._head = offset, checker.position
            self._indexed, self._tail = self._head, []
            self._versions, self._keys = None, None
            self._ensure_writer_state()
            return checker.position
        finally:
            self._lock.release()

    # -- verification and closing -------------------------------------------------------------------

    async def verify(self, *, repair: bool = False) -> VerifyReport:
        from .ndjson_verify import verify_ndjson

        self._check_open()
        if repair:
            await self._lock.acquire()
            try:
                self._sync_locked()
            finally:
                self._lock.release()
        quiet = self._lock.try_acquire()  # no writer in flight: check the whole file
        try:
            size = os.fstat(self._fd).st_size if quiet else self._visible_end()
            report = verify_ndjson(self.path, self._fd, size)
        finally:
            if quiet:
                self._lock.release()
        report.repaired.extend(self.repairs)
        return report

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self.durability == "batch" and self._unsynced_since is not None:
                os.fdatasync(self._fd)
        finally:
            self._close_files()

    def _close_files(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._lock.close()
        self._index.close()
        self._names.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(f"{self.url} is closed; open the store again")

