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
from .ndjson_files import LockFile, StreamNames, event_id_key
from .ndjson_index import PREFIX, RECORD_FIELDS, IndexFile, first_chain, seal
from .ndjson_scan import body_crc, scan, settle

log = logging.getLogger("loopd_es.log")


class Rec(msgspec.Struct, array_like=True):
    """Where one event lives, for events not (yet) in the index file."""

    offset: int
    length: int
    stream: str
    version: int
    key: int
    crc: int


class NdjsonState:
    """The files of one NDJSON log and the in-memory view of them; :class:`~.ndjson.NdjsonLog` adds the API."""

    def __init__(self, path: Path, durability: str, lock_timeout: float) -> None:
        self.path = path
        self.url = f"ndjson:{path}"
        self.durability = durability
        self.repairs: list[str] = []
        self.torn_tail: tuple[int, int] | None = None
        """(byte offset, size) of an unfinished write readers skip, until a writer or ``verify --repair``
        cuts it."""
        self.mismatch_line: int | None = None
        self.index_mismatch: str | None = None
        """Why the log no longer matches its (otherwise sound) index: an edit; reads and appends refuse."""
        self._fd = -1
        self._lock = LockFile(path.with_name(path.name + ".lock"), lock_timeout)
        self._index = IndexFile(path.with_name(path.name + ".idx"))
        self._names = StreamNames(path.with_name(path.name + ".streams"))
        self._end = 0  # bytes of whole, committed writes this instance has seen
        self._head = 0
        self._indexed = 0  # positions 1.._indexed are in the index file
        self._chain = first_chain()  # the chain value of index record _indexed
        self._tail: list[Rec] = []  # positions _indexed+1.._head
        self._versions: dict[str, int] | None = None  # writer state, built on the first append
        self._keys: set[int] | None = None
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
            offset, length, *_, chain = self._index.record(count)
            self._end = offset + length
            self._chain = chain

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
        self._versions = self._keys = None

    def _index_broken(self, why: str) -> None:
        """Rebuild the index from the log when we hold or can take the lock now; else read from the log
        alone and rebuild under the lock on our first write."""
        log.warning("%s: index %s; rebuilding it from the log", self.path, why)
        if self._lock.held:
            self._rebuild_index()
        elif self._lock.try_acquire():
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
        offset, length, number, version, key, crc, _chain = rec
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
        prefixes: list[bytes] = []
        position = 0
        offset = 0
        for lines, envs in scan(self.path, self._fd, 0, stop, 1):  # scan first: a damaged log keeps its index
            for line, env in zip(lines, envs, strict=True):
                number = numbers.setdefault(env.stream, len(numbers))
                key = event_id_key(env.event_id)
                prefixes.append(PREFIX.pack(offset, len(line), number, env.version, key, body_crc(line)))
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
        self._versions = self._keys = None

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
            prefixes.append(PREFIX.pack(rec.offset, rec.length, number, rec.version, rec.key, rec.crc))
        records, chain = seal(prefixes, self._index.chain_before(on_disk + 1))
        self._index.append(records, on_disk)
        self._indexed, self._tail, self._chain = self._head, [], chain

    def _ensure_writer_state(self) -> None:
        """Stream versions and event-id keys of the whole log, built once from the index (checked whole)."""
        if self._versions is not None:
            return
        if not self._index.intact(self._indexed):
            self._index_broken("fails its checksum")
            self._refresh()
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

    # -- keeping up with the file -------------------------------------------------------------------

    def _visible_end(self) -> int:
        """The end of what readers may see: not past a write in flight."""
        size = os.fstat(self._fd).st_size
        intent = self._lock.intent()
        if intent is not None and intent[0] < size and not self._lock.held:
            return intent[0]
        return size

    def _refresh(self) -> None:
        """Catch up (in memory) on whole writes appended since we last looked."""
        visible = self._visible_end()
        if visible < self._end:
            raise CorruptLogError(
                str(self.path), None, f"the log shrank from {self._end} to {visible} bytes behind our back"
            )
        if visible > self._end:
            self._catch_up(settle(self.path, self._fd, self._end, visible, self._head + 1))
        # what is left past the last whole write is an unfinished one (an in-flight one is not visible)
        self.torn_tail = (self._end, visible - self._end) if visible > self._end else None

    def _catch_up(self, stop: int) -> None:
        offset = self._end
        for lines, envs in scan(self.path, self._fd, offset, stop, first_position=self._head + 1):
            for line, env in zip(lines, envs, strict=True):
                key = event_id_key(env.event_id)
                self._tail.append(Rec(offset, len(line), env.stream, env.version, key, body_crc(line)))
                offset += len(line)
                self._head = env.position
                if self._versions is not None:
                    self._versions[env.stream] = env.version
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
        if size != self._end:
            intent = self._lock.intent()
            if intent is not None and self._end <= intent[0] < size:
                self._truncate(intent[0], size, "an unacknowledged write of a writer that died")
                size = intent[0]
            if intent is not None:
                self._lock.clear_intent()
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
        self._ensure_writer_state()

    def _truncate(self, offset: int, size: int, what: str) -> None:
        os.ftruncate(self._fd, offset)
        os.fsync(self._fd)
        message = f"repaired {self.path}: dropped {size - offset} bytes at byte offset {offset}: {what}"
        log.warning("%s", message)
        self.repairs.append(message)

    # -- closing ------------------------------------------------------------------------------------

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

    def _check_usable(self) -> None:
        """Open, and its log still matches its index.

        :raises CorruptLogError: when it does not (see :attr:`index_mismatch`).
        """
        self._check_open()
        if self.index_mismatch is not None:
            raise CorruptLogError(str(self.path), self.mismatch_line, self.index_mismatch)
