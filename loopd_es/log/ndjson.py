"""The NDJSON backend: one envelope per line in a plain file that any tool can read.

Writes. Appends from one process are gathered into one group commit (one ``write``, one ``fdatasync``)
by whichever task arrives first; that task takes the cross-process ``flock``, catches up on what other
processes appended, cuts a crashed writer's unfinished write, checks ids and versions, writes and indexes,
releases the lock, syncs (so the syncs of writer processes overlap), raises the durable end the lock file
records and only then acknowledges. The sync runs on the event-loop thread on purpose: on this machine class
a thread hand-off costs about half an fsync, and group commit means one fsync per batch of writers.

Reads never take the lock; they stop at the durable end (see :mod:`.ndjson_files`) and before an unfinished
write (see :mod:`.ndjson_scan`), so a reader never sees an event that could still disappear.
"""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Final

import anyio
import anyio.lowlevel

from ..errors import CorruptLogError, StoreUnavailableError, StreamNotFoundError, UsageError
from ..private_files import PRIVATE_FILE
from .base import (
    READ_BATCH,
    LogStore,
)
from .coord import Claim, check_swap, failed_fence, swap_in, with_prefix
from .group_commit import Request, prepare_path
from .invariants import SequenceChecker, VerifyReport
from .ndjson_coord import CoordFile
from .ndjson_files import event_id_key, id_time_range
from .ndjson_foreign import check_is_log
from .ndjson_index import CRC, KEY, LENGTH, NUMBER, OFFSET, PREV, RECORD_FIELDS, VERSION, Record
from .ndjson_scan import IndexMismatch, Span, read_spans, scan
from .ndjson_state import NdjsonState, Rec, log
from .ndjson_write import Staged, stage_group, stage_import

if TYPE_CHECKING:
    from ..events.envelope import Envelope

DURABILITY: Final = ("always", "batch", "none")
_BATCH_SYNC_SECONDS: Final = 0.05


class NdjsonLog(NdjsonState, LogStore):
    """An append-only log in one NDJSON file, safe for many processes appending at once."""

    def __init__(self, path: Path, durability: str, lock_timeout: float, create: bool = True) -> None:
        super().__init__(path, durability, lock_timeout, create)
        self._unsynced_since: float | None = None
        self._coord = CoordFile(path.with_name(path.name + ".coord"))

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
        store = cls(path, durability, lock_timeout, create)
        store.read_only = not create
        try:
            store._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE)
        except OSError as e:
            store._close_files()
            raise StoreUnavailableError(
                f"cannot open {path}: {e.strerror}; check --store and permissions"
            ) from e
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
        head = self._horizon_head
        if position > head:
            return
        offset = self._offset_of(position)
        # read only what the limit asks for: up to the start of the first event past it
        stop = (
            self._horizon
            if remaining < 0 or position + remaining > head
            else self._offset_of(position + remaining)
        )
        batch: list[Envelope] = []
        first = position
        for lines, envs in scan(self.path, self._fd, offset, stop, first_position=position):
            self._check_lines(first, lines)
            first += len(lines)
            for env in envs:
                batch.append(env)
                if len(batch) == READ_BATCH:
                    yield batch
                    batch = []
            await anyio.lowlevel.checkpoint()
        if batch:
            yield batch

    def _check_lines(self, first: int, lines: list[bytes]) -> None:
        """Check indexed lines (positions ``first``..) against their records' checksums.

        :raises CorruptLogError: naming the first line that was changed after it was written.
        """
        count = min(len(lines), self._indexed - first + 1)
        if count <= 0:
            return
        crc = zlib.crc32
        at = 0
        for chunk in self._index.chunks(first - 1, first - 1 + count):
            for slot in chunk[CRC::RECORD_FIELDS]:
                if crc(lines[at].rstrip(b" \n")) != slot & 0xFFFFFFFF:
                    raise self._corrupt(
                        first + at,
                        "the line does not match its checksum: it was changed after it was written",
                    )
                at += 1

    async def read_stream(
        self, stream: str, from_version: int = 1, limit: int | None = None
    ) -> AsyncIterator[Envelope]:
        self._check_usable()
        self._refresh()
        spans = self._checked_spans(stream, 1)
        if not spans:
            raise StreamNotFoundError(stream)
        async for batch in self._read_stream_batches(
            stream, from_version, -1 if limit is None else limit, spans
        ):
            for envelope in batch:
                yield envelope

    async def _read_stream_batches(
        self, stream: str, from_version: int, remaining: int, spans: list[Span] | None = None
    ) -> AsyncIterator[list[Envelope]]:
        if spans is None:
            spans = self._checked_spans(stream, max(from_version, 1))
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
                spans = spans[:i] + self._checked_spans(stream, max(from_version, 1) + i)
                continue
            for env in envs:
                if env.stream != stream:
                    raise self._corrupt(
                        env.position, f"the index points at stream {env.stream!r}, not {stream!r}"
                    )
            yield envs
            i += len(chunk)
            if remaining >= 0:
                remaining -= len(envs)
                if remaining <= 0:
                    return
            await anyio.lowlevel.checkpoint()

    def _stream_spans(self, stream: str, from_version: int) -> list[Span]:
        """(offset, length, checksum, position) of the stream's events from ``from_version``, found by
        following each event's link to the previous one of its stream: the cost is the stream's, not the log's.

        :raises IndexMismatch: when a link leads to a record of another stream or version.
        """
        version, position = self._stream_head(stream)
        spans: list[Span] = []
        while position > self._indexed and version >= from_version:
            rec = self._tail[position - self._indexed - 1]
            if rec.stream != stream or rec.version != version:
                raise IndexMismatch(str(self.path), position, f"the tail does not hold version {version}")
            spans.append((rec.offset, rec.length, rec.crc, position))
            position, version = rec.prev, version - 1
        number = self._names.number(stream)
        block: list[Record] = []
        low = 0
        want = 1  # records per read, grown while the stream's events sit side by side (a batch)
        while position > 0 and version >= from_version:
            if not low <= position < low + len(block):
                low = max(1, position - want + 1)
                block = self._index.records(low, position)
                want = min(want * 4, 1024)
                if position - low >= len(block):
                    raise IndexMismatch(str(self.path), position, "the index ends before this record")
            r = block[position - low]
            if r[NUMBER] != number or r[VERSION] != version:
                raise IndexMismatch(
                    str(self.path), position, f"the index does not hold version {version} here"
                )
            spans.append((r[OFFSET], r[LENGTH], r[CRC] & 0xFFFFFFFF, position))
            if r[PREV] != position - 1:
                want = 1
            position, version = r[PREV], version - 1
        if position == 0 and version >= max(from_version, 1):
            raise IndexMismatch(
                str(self.path), None, f"stream {stream!r} ends at version {version + 1}, not 1"
            )
        spans.reverse()
        while spans and spans[-1][3] > self._horizon_head:  # not yet durable: not for readers
            spans.pop()
        return spans

    def _checked_spans(self, stream: str, from_version: int) -> list[Span]:
        """:meth:`_stream_spans`, rebuilding the index (or reading from the log alone) once when it is wrong."""
        try:
            return self._stream_spans(stream, from_version)
        except IndexMismatch as e:
            self._index_broken(str(e))
            self._refresh()
            return self._stream_spans(stream, from_version)

    def _corrupt(self, position: int | None, why: str) -> Exception:
        from ..errors import CorruptLogError

        return CorruptLogError(str(self.path), position, why)

    async def head(self) -> int:
        self._check_usable()
        self._refresh()
        return self._horizon_head

    async def stream_version(self, stream: str) -> int:
        self._check_usable()
        self._refresh()
        try:
            version, position = self._stream_head(stream)
        except IndexMismatch as e:
            self._index_broken(str(e))
            self._refresh()
            version, position = self._stream_head(stream)
        if position > self._horizon_head:  # its last events are not durable yet
            return len(self._checked_spans(stream, 1))
        return version

    async def streams(self) -> list[str]:
        self._check_usable()
        self._refresh()
        return sorted(name for name, version in self._all_versions().items() if version > 0)

    # -- writing ------------------------------------------------------------------------------------

    async def _submit(self, request: Request) -> list[Envelope]:
        self._check_usable()
        return await self._group.submit(request)

    async def _commit(self, group: list[Request]) -> None:
        if self.read_only:
            self._make_sidecars_real()  # a write through a store opened to read needs the real lock and index
        if not self._lock.try_acquire():
            await self._lock.acquire()
        try:
            self._sync_locked()
            group = self._fenced_out(group)
            staged = self._write_group(group) if group else None
        except OSError as e:
            raise StoreUnavailableError(
                f"cannot write {self.path}: {e.strerror}; nothing was appended"
            ) from e
        finally:
            self._lock.release()  # before the sync: other processes write and sync meanwhile
        if staged is None:
            return
        try:
            self._sync_for_durability()
        except OSError as e:
            raise StoreUnavailableError(
                f"cannot sync {self.path}: {e.strerror}; the events were written but may not be durable: "
                "read the stream before retrying (a retry with the same event ids is safe)"
            ) from e
        try:
            self._lock.advance_synced(staged.end)  # our sync covered every byte written before it
        except OSError as e:  # durable all the same: readers see it once a later writer records its end
            log.warning("%s: cannot record the durable end (%s)", self.path, e)
        for request, envelopes, _keys in staged.accepted:
            request.result = envelopes

    def _fenced_out(self, group: list[Request]) -> list[Request]:
        """Under the lock: the requests whose fences hold; the others get their :class:`FenceLostError` now."""
        if not any(request.fences for request in group):
            return group
        records = self._coord.load()
        kept = []
        for request in group:
            lost = failed_fence(request.fences, records)
            if lost is None:
                kept.append(request)
            else:
                request.error = lost
        return kept

    async def coord_read(self, prefix: str = "") -> list[Claim]:
        self._check_open()
        await anyio.lowlevel.checkpoint()
        return with_prefix(self._coord.load().values(), prefix)

    async def coord_swap(self, key: str, expected_token: int, new: Claim | None) -> Claim | None:
        self._check_open()
        check_swap(key, expected_token, new)
        if self.read_only:
            self._make_sidecars_real()
        if not self._lock.try_acquire():
            await self._lock.acquire()
        try:  # no await from here to the release: no other task of this process can take the lock meanwhile
            records = self._coord.load()
            found = swap_in(records, key, expected_token, new)
            if found is None:
                self._coord.store(records)
            return found
        finally:
            self._lock.release()

    def _write_group(self, group: list[Request]) -> Staged | None:
        """Under the lock: check, write and index the group; the caller syncs, then acknowledges."""
        low, high = id_time_range([new.event_id for request in group for new in request.all_events])
        if self._keys is None and low <= self._max_time:
            self._ensure_keys()  # an id that may be recorded already: check it against every id
        try:
            for request in group:
                for part in request.parts:
                    self._stream_head(part.stream)  # staging then finds each stream's head in the cache
        except IndexMismatch as e:
            self._index_broken(str(e))  # we hold the lock: this rebuilds it
            self._refresh()
        staged = stage_group(
            group, self._head, self._end, self._chain, max(self._max_time, high), self._stream_head, self._names,
            self._find_retry,
        )  # fmt: skip
        if not staged.accepted:
            return None
        self._write_all(staged.data)
        # from here on the events are appended: whatever happens to the index, the callers are told so
        before = (self._indexed, self._chain)
        try:
            self._index.write_at(staged.records, self._head)  # _sync_locked left the index at _head records
        except OSError as e:
            log.warning("%s: cannot write the index (%s); the next writer brings it up to date", self.path, e)
            names = self._names.names
            self._tail.extend(Rec(o, n, names[s], v, k, c, p, t) for o, n, s, v, k, p, t, c in staged.fields)
        else:
            self._indexed, self._chain = staged.head, staged.chain
            first = before[0] + 1
            self._update_heads({f[2]: first + i for i, f in enumerate(staged.fields)}, before)
        self._head = staged.head
        self._end = staged.end
        self._max_time = staged.max_time
        for request, envelopes, keys in staged.accepted:
            if len(request.parts) == 1:
                self._heads[request.stream] = (envelopes[-1].version, envelopes[-1].position)
            else:
                self._heads.update((env.stream, (env.version, env.position)) for env in envelopes)
            if self._keys is not None:
                self._keys.update(keys)
        return staged

    def _write_all(self, data: bytes) -> None:
        """Under the lock: write ``data`` at the end; on failure cut what was written (nothing follows it)."""
        start = self._end
        try:
            written = 0
            while written < len(data):
                written += os.pwrite(self._fd, data[written:], start + written)
        except OSError:
            os.ftruncate(self._fd, start)
            raise

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
        known = self._keys
        if known is None:  # every id is newer than any recorded one (see _write_group)
            if not staged or staged.keys().isdisjoint(keys):
                return None
            known = set()
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
        for chunk, base, position in self._index.matches(KEY, key, self._indexed):
            span = (chunk[base + OFFSET], chunk[base + LENGTH], chunk[base + CRC] & 0xFFFFFFFF, position)
            env = read_spans(self.path, self._fd, [span])[0]
            if env.event_id == event_id:
                return env
        return None

    async def import_envelopes(self, batches: AsyncIterator[list[Envelope]]) -> int:
        self._check_usable()
        self._make_sidecars_real()
        await self._lock.acquire()
        try:
            self._sync_locked()
            if self._head or os.fstat(self._fd).st_size:
                raise UsageError(f"{self.url} is not empty ({self._head} events); import only into a new log")
            checker = SequenceChecker(self.url)
            offset = 0
            chain = self._chain
            lasts: dict[str, int] = {}
            max_time = 0
            try:
                async for batch in batches:
                    buffer, records, chain, max_time = stage_import(
                        batch, checker, self._names, offset, chain, lasts, max_time
                    )
                    os.pwrite(self._fd, buffer, offset)
                    self._index.append(records, self._index.count())
                    offset += len(buffer)
                os.fsync(self._fd)
            except BaseException:
                os.ftruncate(self._fd, 0)
                self._index.reset()
                self._names.reset()
                raise
            self._lock.advance_synced(offset)
            self._end, self._head, self._chain = offset, checker.position, chain
            self._indexed, self._tail = self._head, []
            self._heads, self._keys, self._max_time = {}, None, max_time
            self._sync_heads()
            return checker.position
        finally:
            self._lock.release()

    # -- verification and closing -------------------------------------------------------------------

    async def verify(self, *, repair: bool = False) -> VerifyReport:
        from .ndjson_verify import changed_lines, verify_ndjson

        self._check_open()
        if repair:
            self._make_sidecars_real()
            await self._lock.acquire()
            try:
                changed = changed_lines(self._verify_now(True, verify_ndjson))
                if self.index_mismatch is not None or changed:
                    self.repairs.append(
                        f"repaired {self.path}: accepted the log as it is ({changed} changed lines): "
                        "rebuilt the index and its checksums from the log"
                    )
                    self._rebuild_index()
                    synced, size = self._lock.synced(), os.fstat(self._fd).st_size
                    if synced is not None and synced > size:  # what was cut is accepted as gone
                        self._lock.reset_synced(size)
                self._sync_locked()
                synced = self._lock.synced()
                if synced is not None and synced < self._end:
                    os.fdatasync(self._fd)
                    self._lock.advance_synced(self._end)
                    self.repairs.append(
                        f"repaired {self.path}: synced {self._end - synced} bytes at byte offset {synced} that "
                        "their writer had written but not synced (kept: they are whole)"
                    )
            finally:
                self._lock.release()
        report = self._verify_now(False, verify_ndjson)
        report.repaired.extend(self.repairs)
        return report

    def _verify_now(self, locked: bool, check: Callable[..., VerifyReport]) -> VerifyReport:
        synced = None if locked else self._lock.synced()
        return check(self.path, self._fd, os.fstat(self._fd).st_size, synced, self._index)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self.durability == "batch" and self._unsynced_since is not None:
                os.fdatasync(self._fd)
        finally:
            self._close_files()
