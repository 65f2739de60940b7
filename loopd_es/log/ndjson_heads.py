"""The NDJSON stream-heads sidecar (``events.ndjson.heads``): each stream's last position, so that a
one-stream operation starts at the stream's last event instead of searching the index.

A cache like the index: a header ``(magic, records covered, chain value of that record, checksum)`` then one
int64 per stream number. The checksum is the XOR of a CRC-32 per entry, so a writer updates it in O(1) per
entry; a reader checks it (O(streams)) once, and trusts the file only when the header's chain value is the
index's own at that record, which binds the heads to exactly that index prefix. Anything else: the caller
falls back to searching the index.
"""

from __future__ import annotations

import mmap
import os
import struct
import zlib
from pathlib import Path
from typing import Final

from .ndjson_files import Sidecar, open_sidecar

_MAGIC: Final = b"LDESHD01"
_HEADER: Final = struct.Struct("<8sqqq")
_ENTRY: Final = struct.Struct("<q")
_INITIAL: Final = 4096


def _h(number: int, position: int) -> int:
    return zlib.crc32(struct.pack("<qq", number, position))


class HeadsFile(Sidecar):
    """Memory-mapped, so an update costs a memory store, not a system call."""

    def __init__(self, path: Path, create: bool = True) -> None:
        self.path = path
        self.fd, self.stand_in = open_sidecar(path, create)
        self._map: mmap.mmap | None = None
        self._checked: tuple[int, int] | None = None  # (covered, checksum) last found consistent
        self.written: tuple[int, int, int] | None = None
        """The header this instance last wrote: while a writer's (count, chain) still equals it, no other
        writer has touched the file since, so the header need not be read back."""

    def _mapped(self, need: int = 0, recheck: bool = False) -> mmap.mmap | None:
        """The mapping, grown to ``need`` bytes; the file never shrinks (another process's mapping of it
        would fault), so a mapping stays valid and is only remapped when the file grew."""
        m = self._map
        if m is not None and need <= len(m) and not recheck:
            return m
        size = os.fstat(self.fd).st_size
        if need > size:
            size = max(need, 2 * size, _INITIAL)
            os.ftruncate(self.fd, size)
        if size < _HEADER.size:
            return None
        if m is None or len(m) != size:
            if m is not None:
                m.close()
            m = self._map = mmap.mmap(self.fd, size)
        return m

    def header(self) -> tuple[int, int, int] | None:
        """(records covered, chain value of that record, checksum), None when the file is not ours."""
        m = self._mapped()
        if m is None:
            m = self._mapped(recheck=True)
            if m is None:
                return None
        magic, covered, chain, checksum = _HEADER.unpack_from(m, 0)
        return (covered, chain, checksum) if magic == _MAGIC else None

    def usable(self, chain_at: int | None, covered: int) -> bool:
        """Whether the file covers records 1..``covered`` (whose chain value is ``chain_at``) and is intact."""
        header = self.header()
        if header is None or header[0] != covered or header[1] != chain_at:
            return False
        if self._checked == (header[0], header[2]):
            return True
        m = self._mapped(recheck=True)
        assert m is not None
        checksum = 0
        for i, (position,) in enumerate(
            _ENTRY.iter_unpack(m[_HEADER.size : len(m) - (len(m) - _HEADER.size) % 8])
        ):
            if position:
                checksum ^= _h(i, position)
        if checksum != header[2]:
            return False
        self._checked = (header[0], header[2])
        return True

    def get(self, number: int) -> int:
        """The last position of stream ``number`` (0: none) as the file says; the caller checked :meth:`usable`."""
        at = _HEADER.size + number * 8
        m = self._mapped()
        if m is not None and at + 8 > len(m):
            m = self._mapped(recheck=True)
        if m is None or at + 8 > len(m):
            return 0
        return int(_ENTRY.unpack_from(m, at)[0])

    def update(self, heads: dict[int, int], covered: int, chain: int, checksum: int | None = None) -> None:
        """Set stream number -> last position entries and the header (writers only, under the lock);
        ``checksum`` is the header's current one when the caller just read it."""
        if checksum is None:
            header = self.header()
            checksum = header[2] if header is not None else 0
        top = max(heads, default=-1)
        m = self._mapped(_HEADER.size + (top + 1) * 8)
        assert m is not None
        for number, position in heads.items():
            at = _HEADER.size + number * 8
            old = _ENTRY.unpack_from(m, at)[0]
            if old:
                checksum ^= _h(number, old)
            if position:
                checksum ^= _h(number, position)
            _ENTRY.pack_into(m, at, position)
        _HEADER.pack_into(m, 0, _MAGIC, covered, chain, checksum)
        self._checked = (covered, checksum)
        self.written = (covered, chain, checksum)

    def reset(self) -> None:
        """Zero the file in place (never shrink it: see :meth:`_mapped`)."""
        m = self._mapped(recheck=True)
        if m is not None:
            m[:] = bytes(len(m))
        self._checked = self.written = None

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        os.close(self.fd)
