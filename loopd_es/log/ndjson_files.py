"""The files behind an NDJSON log: the log itself, its lock file (with the in-flight write record) and
its index sidecars.

``events.ndjson``          one envelope per line, append-only
``events.ndjson.lock``     ``flock``-ed by writers; its first 16 bytes record the write in flight
                           (start and end offsets), zero when none: readers never read past the start
                           of a write in flight, and a crashed writer's partial write is truncated by the
                           next writer, so a batch lands whole or not at all
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

_INTENT: Final = struct.Struct("<qq")
_NO_INTENT: Final = _INTENT.pack(0, 0)


def event_id_key(event_id: str) -> int:
    """A stable 60-bit key: 15 hex digits that are random in both v4 and v7 UUIDs (equal keys are rechecked)."""
    return int(event_id[20:23] + event_id[24:], 16)


class LockFile:
    """The writers' ``flock`` and the record of the write in flight."""

    def __init__(self, path: Path, timeout: float) -> None:
        self.path = path
        self.timeout = timeout
        self.fd = open_sidecar(path, os.O_RDWR | os.O_CREAT)
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

    def intent(self) -> tuple[int, int] | None:
        """The (start, end) byte range of the write in flight, or None."""
        raw = os.pread(self.fd, _INTENT.size, 0)
        if len(raw) < _INTENT.size:
            return None
        start, end = _INTENT.unpack(raw)
        return (start, end) if end > start else None

    def set_intent(self, start: int, end: int) -> None:
        os.pwrite(self.fd, _INTENT.pack(start, end), 0)

    def clear_intent(self) -> None:
        os.pwrite(self.fd, _NO_INTENT, 0)

    def close(self) -> None:
        self.release()
        os.close(self.fd)


class StreamNames:
    """Stream number <-> name; numbers are assigned in order of first appearance, from 0."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = open_sidecar(path, os.O_RDWR | os.O_CREAT)
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


def open_sidecar(path: Path, flags: int) -> int:
    try:
        return os.open(path, flags | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise StoreUnavailableError(
            f"cannot open {path}: {e.strerror}; check that the directory exists and is writable"
        ) from e
