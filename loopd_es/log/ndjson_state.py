"""What an open NDJSON log knows about its files, and how it keeps that in step with other processes.

The index (see :mod:`.ndjson_index`) is a cache of the log, trusted only as far as it is checked:

- on open, its first and last records are checked against their chain and against the log's lines
  (offset, checksum, position, stream, version, id): a stale index (a prefix of the truth) is caught up
  from the log, an index of another log or a garbled one is rebuilt from the log;
- an index whose first record matches the log but whose last does not means the *log* changed under it (an
  edit): the index is kept as evidence, reads and appends refuse with exit 4, and ``verify`` names the
  lines; ``verify --repair`` accepts the log as it is and rebuilds the index;
- before the whole index is used at once (the writers' ids and versions), its chain is checked end to end
  with one ``crc32`` pass; every record a stream read uses is checked against its line.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import msgspec

from ..errors import CorruptLogError, StorageError
from ..events.envelope import ENVELOPE_DECODER
from .group_commit import GroupCommitter, Request
from .ndjson_files import LockFile, StreamNames, event_id_key, id_time
from .ndjson_heads import HeadsFile
from .ndjson_index import (
    CHAIN,
    CRC,
    KEY,
    LENGTH,
    MAX_TIME,
    NUMBER,
    OFFSET,
    PREFIX,
    RECORD_FIELDS,
    VERSION,
    IndexFile,
    first_chain,
    seal,
)
from .ndjson_scan import IndexMismatch, body_crc, last_write_end, read_spans, scan, settle

log = logging.getLogger("loopd_es.log")


class Rec(msgspec.Struct, array_like=True):
    """Where one event lives, for events not (yet) in the index file."""

    offset: int
    length: int
    stream: str
    version: int
    key: int
    crc: int
    prev: int
    max_time: int


class NdjsonState:
    """The files of one NDJSON log and the in-memory view of them; :class:`~.ndjson.NdjsonLog` adds the API."""

    def __init__(self, path: Path, durability: str, lock_timeout: float, create: bool = True) -> None:
        self.path = path
        self.url = f"ndjson:{path}"
        self.durability = durability
        self.repairs: list[str] = []
        self.torn_tail: tuple[int, int] | None = None
        """(byte offset, size) of an unfinished write readers skip, until a writer or ``verify --repair``
        cuts it."""
        self.read_only = False
        """Opened to read (``create=False``): a bad index is worked around in memory, never rewritten."""
        self.mismatch_line: int | None = None
        self.index_mismatch: str | None = None
        """Why the log no longer matches its (otherwise sound) index: an edit; reads and appends refuse."""
        self._fd = -1
        self._lock = LockFile(path.with_name(path.name + ".lock"), lock_timeout, create)
        self._index = IndexFile(path.with_name(path.name + ".idx"), create)
        self._names = StreamNames(path.with_name(path.name + ".streams"), create)
        self._heads_file = HeadsFile(path.with_name(path.name + ".heads"), create)
        self._end = 0  # bytes of whole, committed writes this instance has seen
        self._head = 0
        self._indexed = 0  # positions 1.._indexed are in the index file
        self._chain = first_chain()  # the chain value of index record _indexed
        self._tail: list[Rec] = []  # positions _indexed+1.._head
        self._synced_seen = False
        self._horizon = 0  # reads stop at this byte and position (see _refresh)
        self._horizon_head = 0
        self._heads: dict[str, tuple[int, int]] = {}  # stream -> (version, last position), filled on demand
        self._keys: set[int] | None = None  # every event-id key, built only when an id may be a retry
        self._max_time = 0  # the largest UUIDv7 time of any recorded id
        self._group = GroupCommitter(self._commit)
        self._closed = False
        self._index_suspect = False

    async def _commit(self, group: list[Request]) -> None:
        raise NotImplementedError

    # -- the index ----------------------------------------------------------------------------------

    def _load_index(self) -> None:
        """Check the index's first and last records against the log; keep, rebuild or keep as evidence."""
        self._names.refresh()
        count = self._index.count()
        size, synced = os.fstat(self._fd).st_size, self._lock.synced()
        if synced is not None and size < synced:  # in this boot: a power cut would have changed the boot
            line = self._first_unmatched(count)
            self.index_mismatch = (
                (f"line {line} and what follows do not match the index; " if line else "")
                + f"the log ends at byte {size}, but writers acknowledged it up to byte {synced}: acknowledged "
                "events were cut from it after they were written; `loopd-es verify` lists the problems, "
                "`loopd-es verify --repair` accepts the log as it is"
            )
            self.mismatch_line = line
            log.warning("%s: %s", self.path, self.index_mismatch)
            self._forget_index()
            return
        last = self._record_check(count) if count else "ok"
        if last != "ok":
            if last == "log" and self._record_matches(1) and self._index.intact(count):
                line = self._first_changed(count)
                self.index_mismatch = (
                    f"line {line} and what follows do not match the index: the log was changed after it was "
                    "written; `loopd-es verify` lists the problems, `loopd-es verify --repair` accepts the "
                    "log as it is"
                )
                self.mismatch_line = line
                log.warning("%s: %s", self.path, self.index_mismatch)
                self._forget_index()
            else:
                self._index_broken("does not match the log")
            return
        self._indexed = self._head = count
        if count:
            rec = self._index.record(count)
            self._end = rec[0] + rec[1]
            self._chain = rec[CHAIN]
            self._max_time = rec[MAX_TIME]

    def _first_unmatched(self, count: int) -> int | None:
        """The first line that no longer matches a sound index, or None when the index is not sound or every
        record it has still matches."""
        if not count or not self._index.intact(count) or self._record_matches(count):
            return None
        return 1 if not self._record_matches(1) else self._first_changed(count)

    def _first_changed(self, count: int) -> int:
        """The first position whose (sound) record no longer matches the log: records 1 and ``count`` are
        known to match and not to match; an edit shifts every later line, so a binary search finds it."""
        good, bad = 1, count
        while bad - good > 1:
            middle = (good + bad) // 2
            if self._record_matches(middle):
                good = middle
            else:
                bad = middle
        return bad

    def _forget_index(self) -> None:
        """Read from the log alone (in memory) until the index is rebuilt under the lock."""
        self._index_suspect = True
        self._indexed = self._head = self._end = 0
        self._chain = first_chain()
        self._tail = []
        self._heads, self._keys, self._max_time = {}, None, 0

    def _index_broken(self, why: str) -> None:
        """Rebuild the index from the log when we hold or can take the lock now (and may write: a store
        opened to read changes nothing); else read from the log alone and rebuild under the lock on our
        first write."""
        log.warning("%s: index %s; rebuilding it from the log", self.path, why)
        if self._lock.held:
            self._rebuild_index()
        elif not self.read_only and self._lock.try_acquire():
            try:
                self._rebuild_index()
            finally:
                self._lock.release()
        else:
            self._forget_index()

    def _record_matches(self, position: int) -> bool:
        return self._record_check(position) == "ok"

    def _record_check(self, position: int) -> str:
        """``ok``; ``index`` when the record (or the stream names) cannot be trusted or points past the log;
        ``log`` when a sound record points at a line that differs from what it recorded."""
        rec = self._index.checked_record(position)
        if rec is None:
            return "index"
        offset, length, number, version, key, _prev, _time, crc, _chain = rec
        if number >= len(self._names.names) or offset + length > os.fstat(self._fd).st_size or length < 2:
            return "index"
        if position == 1 and offset != 0:
            return "index"
        line = os.pread(self._fd, length, offset)
        if not line.endswith(b"\n") or body_crc(line) != crc:
            return "log"
        try:
            env = ENVELOPE_DECODER.decode(line)
        except msgspec.DecodeError:
            return "log"
        same = (
            env.position == position
            and env.version == version
            and env.stream == self._names.names[number]
            and event_id_key(env.event_id) == key
        )
        return "ok" if same else "index"

    def _rebuild_index(self) -> None:
        """Rebuild the index files from the log (a full scan, under the lock)."""
        size = os.fstat(self._fd).st_size
        stop = settle(self.path, self._fd, 0, size, 1)
        numbers: dict[str, int] = {}
        lasts: dict[str, int] = {}
        prefixes: list[bytes] = []
        position = 0
        offset = 0
        max_time = 0
        for lines, envs in scan(self.path, self._fd, 0, stop, 1):  # scan first: a damaged log keeps its index
            for line, env in zip(lines, envs, strict=True):
                number = numbers.setdefault(env.stream, len(numbers))
                key = event_id_key(env.event_id)
                max_time = max(max_time, id_time(env.event_id))
                prev = lasts.get(env.stream, 0)
                lasts[env.stream] = env.position
                prefixes.append(
                    PREFIX.pack(offset, len(line), number, env.version, key, prev, max_time, body_crc(line))
                )
                offset += len(line)
                position += 1
        self._index.reset()
        self._names.reset()
        for name in numbers:
            self._names.add(name)
        self._index_suspect = False
        self.index_mismatch = self.mismatch_line = None
        records, self._chain = seal(prefixes, first_chain())
        self._index.append(records, 0)
        self._indexed = self._head = position
        self._end = offset
        self._tail = []
        self._heads, self._keys, self._max_time = {}, None, max_time
        self._sync_heads()

    def _flush_tail(self) -> None:
        """Write index records for events we know of that the index file lacks."""
        on_disk = self._index.count()
        if on_disk >= self._head:
            self._indexed, self._tail = self._head, []
            self._chain = self._index.chain_before(self._head + 1)
            return
        if on_disk < self._indexed:
            self._rebuild_index()
            return
        prefixes = []
        for rec in self._tail[on_disk - self._indexed :]:
            number = self._names.number(rec.stream)
            if number is None:
                number = self._names.add(rec.stream)
            prefixes.append(
                PREFIX.pack(
                    rec.offset, rec.length, number, rec.version, rec.key, rec.prev, rec.max_time, rec.crc
                )
            )
        before = (on_disk, self._index.chain_before(on_disk + 1))
        records, chain = seal(prefixes, before[1])
        self._index.append(records, on_disk)
        touched = {}
        for i, rec in enumerate(self._tail[on_disk - self._indexed :]):
            number = self._names.number(rec.stream)
            assert number is not None
            touched[number] = on_disk + 1 + i
        self._indexed, self._tail, self._chain = self._head, [], chain
        self._update_heads(touched, before)

    def _ensure_keys(self) -> None:
        """Every recorded event-id key, from the whole index (checked end to end first) and the tail."""
        if self._keys is not None:
            return
        if not self._index.intact(self._indexed):
            self._index_broken("fails its checksum")
            self._refresh()
        keys: set[int] = set()
        for chunk in self._index.chunks(0, self._indexed):
            keys.update(chunk[KEY::RECORD_FIELDS])
        keys.update(rec.key for rec in self._tail)
        self._keys = keys

    def _all_versions(self) -> dict[str, int]:
        """Every stream's version, from the whole index and the tail (for ``streams``)."""
        versions: dict[int, int] = {}
        horizon = self._horizon_head  # not past what readers may see
        for chunk in self._index.chunks(0, min(self._indexed, horizon)):
            versions.update(zip(chunk[NUMBER::RECORD_FIELDS], chunk[VERSION::RECORD_FIELDS], strict=True))
        self._names.refresh()
        by_name = {self._names.names[number]: version for number, version in versions.items()}
        for rec in self._tail[: max(0, horizon - self._indexed)]:
            by_name[rec.stream] = rec.version
        return by_name

    def _stream_head(self, stream: str) -> tuple[int, int]:
        """(version, position of the last event) of ``stream``, (0, 0) when it has none: from the cache, the
        tail, or the index searched backwards (the cost is the distance from the end, not the log's size).

        :raises IndexMismatch: when the index record found does not pass its chain check.
        """
        hit = self._heads.get(stream)
        if hit is not None:
            return hit
        result = (0, 0)
        for i in range(len(self._tail) - 1, -1, -1):
            if self._tail[i].stream == stream:
                result = (self._tail[i].version, self._indexed + 1 + i)
                break
        else:
            number = self._names.number(stream)
            if number is not None:
                result = self._indexed_head(number)
        self._heads[stream] = result
        return result

    def _indexed_head(self, number: int) -> tuple[int, int]:
        """(version, position) of stream ``number``'s last indexed event: from the heads file when it is sound
        (searching only the records it does not cover), else by searching the index backwards."""
        floor = 0
        header = self._heads_file.header()
        if header is not None and header[0] <= self._indexed:
            covered = header[0]
            if self._heads_file.usable(self._index.chain_before(covered + 1), covered):
                floor = covered
        found = self._index.last_match(NUMBER, number, self._indexed, floor)
        if found is None and floor:
            position = self._heads_file.get(number)
            found = (position, self._index.record(position)) if 0 < position <= floor else None
        if found is None:
            return (0, 0)
        position, rec = found
        if rec[NUMBER] != number or self._index.checked_record(position) is None:
            raise IndexMismatch(
                str(self.path), position, "the index record of the stream's last event is wrong"
            )
        # an append relies on this version: confirm it from the event's own line, not from the cache alone
        # (an index edited and resealed passes its chain check); a line that disagrees rebuilds the index
        env = read_spans(self.path, self._fd, [(rec[OFFSET], rec[LENGTH], rec[CRC] & 0xFFFFFFFF, position)])[
            0
        ]
        names = self._names.names
        if env.version != rec[VERSION] or number >= len(names) or env.stream != names[number]:
            raise IndexMismatch(
                str(self.path),
                position,
                "the index record of the stream's last event disagrees with its line",
            )
        return (rec[VERSION], position)

    def _update_heads(self, touched: dict[int, int], before: tuple[int, int]) -> None:
        """After index records ``before[0]``+1.._indexed were written: record the touched streams' heads, if
        the heads file covered exactly ``before`` (count, chain); else it is rebuilt on the next sync."""
        written = self._heads_file.written
        header = written if written is not None and written[:2] == before else self._heads_file.header()
        if header is not None and (header[0], header[1]) == before:
            try:
                self._heads_file.update(touched, self._indexed, self._chain, header[2])
            except OSError as e:  # a cache: it is rebuilt on the next sync
                log.warning("%s: cannot update the stream heads (%s)", self.path, e)

    def _sync_heads(self) -> None:
        """Under the lock: make the heads file cover the whole index (rebuilt in one pass when it does not)."""
        written = self._heads_file.written
        if written is not None and written[:2] == (self._indexed, self._chain):
            return
        header = self._heads_file.header()
        if header is not None and (header[0], header[1]) == (self._indexed, self._chain):
            return
        lasts: dict[int, int] = {}
        first = 1
        for chunk in self._index.chunks(0, self._indexed):
            numbers = chunk[NUMBER::RECORD_FIELDS]
            lasts.update(zip(numbers, range(first, first + len(numbers)), strict=True))
            first += len(numbers)
        self._heads_file.reset()
        self._heads_file.update(lasts, self._indexed, self._chain)

    # -- keeping up with the file -------------------------------------------------------------------

    def _visible_end(self) -> int:
        """The end of what readers may see: what writers have made durable (writers under the lock see all)."""
        size = os.fstat(self._fd).st_size
        if self._lock.held:
            return size
        synced = self._lock.synced()
        return size if synced is None else min(size, synced)

    def _refresh(self) -> None:
        """Catch up (in memory) on whole, durable writes appended since we last looked, and set the horizon
        reads stop at (below our own view while other writers' or our own writes are still being synced)."""
        visible = self._visible_end()
        if os.fstat(self._fd).st_size < self._end:
            raise CorruptLogError(
                str(self.path), None, f"the log shrank below {self._end} bytes behind our back"
            )
        if visible > self._end:
            self._catch_up(settle(self.path, self._fd, self._end, visible, self._head + 1))
        # what is left past the last whole write is an unfinished one; past the durable end, bytes with no
        # whole write among them are one too (whole writes there are still being synced: not torn)
        size = os.fstat(self._fd).st_size
        if visible > self._end:
            self.torn_tail = (self._end, visible - self._end)
        elif size > visible and visible >= self._end and last_write_end(self._fd, visible, size) == visible:
            self.torn_tail = (visible, size - visible)
        else:
            self.torn_tail = None
        if visible >= self._end:
            self._horizon, self._horizon_head = self._end, self._head
        else:
            self._horizon, self._horizon_head = visible, self._position_before(visible)

    def _position_before(self, offset: int) -> int:
        """The last position whose line ends at or before ``offset`` (a write boundary)."""
        low, high = 0, self._head  # invariant: position low ends <= offset; high + 1 starts >= offset
        while low < high:
            middle = (low + high + 1) // 2
            if self._offset_of(middle) < offset:
                low = middle
            else:
                high = middle - 1
        return low

    def _offset_of(self, position: int) -> int:
        if position <= self._indexed:
            return self._index.record(position)[0]
        return self._tail[position - self._indexed - 1].offset

    def _catch_up(self, stop: int) -> None:
        """Take in the whole writes up to ``stop``, a chunk at a time: the end read and the head move together
        after each chunk, so a damaged line in a later chunk leaves a state the next call resumes from (and
        names the same line again), not a head past an end read from the start again."""
        offset = self._end
        for lines, envs in scan(self.path, self._fd, offset, stop, first_position=self._head + 1):
            for line, env in zip(lines, envs, strict=True):
                key = event_id_key(env.event_id)
                self._max_time = max(self._max_time, id_time(env.event_id))
                prev = self._stream_head(env.stream)[1] if env.version > 1 else 0
                rec = Rec(
                    offset, len(line), env.stream, env.version, key, body_crc(line), prev, self._max_time
                )
                self._tail.append(rec)
                offset += len(line)
                self._head = env.position
                self._heads[env.stream] = (env.version, env.position)
                if self._keys is not None:
                    self._keys.add(key)
            self._end = offset

    def _sync_locked(self) -> None:
        """Under the lock: cut a crashed writer's unfinished write, catch up, bring the index up to date.

        :raises CorruptLogError: when the log was changed under its index, or a committed line is damaged.
        """
        if self.index_mismatch is not None:
            raise CorruptLogError(str(self.path), self.mismatch_line, self.index_mismatch)
        if self._index_suspect:
            self._rebuild_index()
        size = os.fstat(self._fd).st_size
        if not self._synced_seen:
            if (
                self._lock.synced() is None
            ):  # nothing recorded in this boot: the file is as durable as it gets
                self._lock.reset_synced(size)
            self._synced_seen = True  # recorded in this boot: it stays recorded while we run
        if size != self._end:
            if size < self._end:
                raise CorruptLogError(
                    str(self.path), None, f"the log shrank from {self._end} to {size} bytes behind our back"
                )
            settled = settle(self.path, self._fd, self._end, size, self._head + 1)
            self._catch_up(settled)
            if settled < size:
                self._truncate(settled, size, "an unfinished write (never acknowledged)")
            self._flush_tail()
        elif self._tail:
            self._flush_tail()
        self.torn_tail = None
        self._sync_heads()

    def _truncate(self, offset: int, size: int, what: str) -> None:
        os.ftruncate(self._fd, offset)
        os.fsync(self._fd)
        synced = self._lock.synced()
        if synced is not None and synced > offset:
            self._lock.reset_synced(offset)
        message = f"repaired {self.path}: dropped {size - offset} bytes at byte offset {offset}: {what}"
        log.warning("%s", message)
        self.repairs.append(message)

    # -- closing ------------------------------------------------------------------------------------

    def _make_sidecars_real(self) -> None:
        """Before a write by a store opened to read (``verify --repair``): create missing sidecars."""
        for sidecar in (self._lock, self._index, self._names, self._heads_file):
            sidecar.make_real()

    def _close_files(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._lock.close()
        self._index.close()
        self._names.close()
        self._heads_file.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(f"{self.url} is closed; open the store again")

    def _check_usable(self) -> None:
        """Open, and its log still matches its index.

        :raises CorruptLogError: when it does not (see :attr:`index_mismatch`).
        """
        self._check_open()
        if self.index_mismatch is not None:
            raise CorruptLogError(str(self.path), self.mismatch_line, self.index_mismatch)
