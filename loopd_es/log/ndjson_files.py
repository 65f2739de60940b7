"""The files behind an NDJSON log: the log itself, its lock file (with the in-flight write record) and
its index sidecars.

``events.ndjson``          one envelope per line, append-only
``events.ndjson.lock``     ``flock``-ed by writers while they check, write and index (not while they
                           sync: the syncs of several processes overlap); its first 24 bytes record the
                           end of what writers have made durable and the boot it was recorded in:
                           readers never read past it, so they never see an event whose fsync has not
                           returned
``events.ndjson.idx``      fixed 48-byte records per position (see :mod:`.ndjson_index`): a cache with
                           a checksum chain and a checksum of each line, validated and rebuilt from the
                           log when it does not match
``events.ndjson.streams``  stream names, one per line; line *n* is stream number *n*
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import time
from pathlib import Path
from typing import Final

import anyio

from ..errors import LockTimeoutError, StoreUnavailableError
from ..private_files import PRIVATE_FILE

_SYNCED: Final = struct.Struct("<q16s")  # durable end, boot id
_SYNC_LOCK_BYTE: Final = 4096
_BOOT: list[bytes] = []


def _boot_id() -> bytes:
    """This boot's id (Linux), so a durable end recorded before a restart is not trusted after it."""
    if not _BOOT:
        try:
            text = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
            _BOOT.append(bytes.fromhex(text.replace("-", ""))[:16].ljust(16, b"\1"))
        except (OSError, ValueError):
            _BOOT.append(b"no-boot-id-here!")
    return _BOOT[0]


def open_sidecar(path: Path, create: bool = True) -> tuple[int, bool]:
    """(fd, stand-in) of a sidecar file. Without ``create`` a missing sidecar is not created: the fd is
    ``/dev/null`` (reads find it empty, as for a new sidecar) and ``stand-in`` is true, so a store opened to
    read leaves the log's directory as it found it.

    :raises StoreUnavailableError: when the file cannot be opened.
    """
    try:
        if not create:
            try:
                return os.open(path, os.O_RDWR | os.O_CLOEXEC), False
            except FileNotFoundError:
                return os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC), True
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE), False
    except OSError as e:
        raise StoreUnavailableError(
            f"cannot open {path}: {e.strerror}; check that the directory exists and is writable"
        ) from e


class Sidecar:
    """A sidecar file that a store opened to read may stand in for with ``/dev/null`` until it must write."""

    path: Path
    fd: int
    stand_in: bool

    def make_real(self) -> None:
        """Create the file when a write (``verify --repair``) needs it."""
        if self.stand_in:
            os.close(self.fd)
            self.fd, self.stand_in = open_sidecar(self.path)


def event_id_key(event_id: str) -> int:
    """A stable 60-bit key: 15 hex digits that are random in both v4 and v7 UUIDs (equal keys are rechecked)."""
    return int(event_id[20:23] + event_id[24:], 16)


def id_time(event_id: str) -> int:
    """The leading 60 bits of a UUIDv7 id (millisecond time and the counter ``new_event_id`` keeps in
    ``rand_a``), 0 for any other: an id above every recorded one cannot be recorded already."""
    if event_id[14] != "7":
        return 0
    return int(event_id[:8] + event_id[9:13] + event_id[15:18], 16)


def id_time_range(event_ids: list[str]) -> tuple[int, int]:
    """(smallest, largest) :func:`id_time` of ``event_ids``: for lower-case UUIDv7 ids (what
    ``new_event_id`` makes) string order is that order, so ``min``/``max`` find them at C speed."""
    joined = "".join(event_ids)
    if joined.islower() and not joined[14::36].strip("7"):
        return id_time(min(event_ids)), id_time(max(event_ids))
    times = [id_time(event_id) for event_id in event_ids]
    return min(times), max(times)


class LockFile(Sidecar):
    """The writers' ``flock`` and the durable end."""

    def __init__(self, path: Path, timeout: float, create: bool = True) -> None:
        self.path = path
        self.timeout = timeout
        self.fd, self.stand_in = open_sidecar(path, create)
        self.held = False

    async def acquire(self) -> None:
        """Take the exclusive lock, polling (never blocking the event loop) until ``timeout``.

        :raises LockTimeoutError: when another writer keeps it longer than ``timeout``.
        """
        if self._try():
            return
        deadline = time.monotonic() + self.timeout
        delay = 0.0002
        while True:
            await anyio.sleep(delay)
            if self._try():
                return
            if time.monotonic() > deadline:
                raise LockTimeoutError(str(self.path), self.timeout)
            delay = min(delay * 2, 0.005)

    def try_acquire(self) -> bool:
        """Take the lock only if it is free right now."""
        return self._try()

    def _try(self) -> bool:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        except OSError as e:
            if e.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise StoreUnavailableError(f"cannot lock {self.path}: {e.strerror}") from e
        self.held = True
        return True

    def release(self) -> None:
        if self.held:
            self.held = False
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def synced(self) -> int | None:
        """The end of what writers have made durable, or None when this boot has not recorded it (a new
        log, or one last written before a restart: then everything in the file is as durable as it gets)."""
        raw = os.pread(self.fd, _SYNCED.size, 0)
        if len(raw) < _SYNCED.size:
            return None
        end, boot = _SYNCED.unpack(raw)
        return end if boot == _boot_id() else None

    def advance_synced(self, end: int) -> None:
        """Record that every byte before ``end`` is durable, unless a larger end is recorded already (writers
        sync outside the lock, so they finish in any order); a short ``lockf`` makes read-and-raise atomic."""
        fcntl.lockf(self.fd, fcntl.LOCK_EX, 1, _SYNC_LOCK_BYTE)
        try:
            current = self.synced()
            if current is None or end > current:
                os.pwrite(self.fd, _SYNCED.pack(end, _boot_id()), 0)
        finally:
            fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, _SYNC_LOCK_BYTE)

    def reset_synced(self, end: int) -> None:
        """Under the writers' lock: record ``end`` as the durable end, even below what is recorded (after a
        repair cut bytes that were never synced)."""
        fcntl.lockf(self.fd, fcntl.LOCK_EX, 1, _SYNC_LOCK_BYTE)
        try:
            os.pwrite(self.fd, _SYNCED.pack(end, _boot_id()), 0)
        finally:
            fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, _SYNC_LOCK_BYTE)

    def close(self) -> None:
        self.release()
        os.close(self.fd)


class StreamNames(Sidecar):
    """Stream number <-> name; numbers are assigned in order of first appearance, from 0."""

    def __init__(self, path: Path, create: bool = True) -> None:
        self.path = path
        self.fd, self.stand_in = open_sidecar(path, create)
        self.names: list[str] = []
        self.numbers: dict[str, int] = {}
        self._read_to = 0

    def refresh(self) -> None:
        """Pick up names other processes added."""
        size = os.fstat(self.fd).st_size
        if size <= self._read_to:
            return
        data = os.pread(self.fd, size - self._read_to, self._read_to)
        end = data.rfind(b"\n") + 1
        for raw in data[:end].splitlines():
            name = raw.decode("utf-8")
            self.numbers[name] = len(self.names)
            self.names.append(name)
        self._read_to += end

    def number(self, name: str) -> int | None:
        found = self.numbers.get(name)
        if found is None:
            self.refresh()
            found = self.numbers.get(name)
        return found

    def add(self, name: str) -> int:
        """Record a new stream (writers only, under the lock)."""
        line = name.encode("utf-8") + b"\n"
        os.ftruncate(self.fd, self._read_to)  # drop a torn name a crashed writer left
        os.pwrite(self.fd, line, self._read_to)
        self._read_to += len(line)
        number = len(self.names)
        self.names.append(name)
        self.numbers[name] = number
        return number

    def reset(self) -> None:
        os.ftruncate(self.fd, 0)
        self.names.clear()
        self.numbers.clear()
        self._read_to = 0

    def close(self) -> None:
        os.close(self.fd)
