"""The NDJSON position index: one fixed record per event, checked by a checksum chain.

A record is ``offset, length, stream number, version, event-id key, previous position of the same stream,
an upper bound of the UUIDv7 order of every id so far``  (int64 each), the CRC-32 of the event's line (uint32) and a chain value
(uint32): the CRC-32 of every byte of the index before it, so
``chain(p) = crc32(chain(p-1) bytes + record p without its chain, chain(p-1))``. That gives two cheap checks:

- one record, against its predecessor (two records read): an edited, zeroed or swapped record fails;
- the whole index, with one C-speed ``crc32`` over the file compared with the last chain value.

The line CRC lets ``verify`` and reads detect a payload edited in the log that is still valid JSON.
"""

from __future__ import annotations

import os
import struct
import zlib
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from .ndjson_files import Sidecar, open_sidecar

PREFIX: Final = struct.Struct(
    "<qqqqqqqI"
)  # offset, length, number, version, key, prev, max id time, line CRC
RECORD_SIZE: Final = PREFIX.size + 4
RECORD_FIELDS: Final = (
    RECORD_SIZE // 8
)  # int64 slots per record in the arrays :meth:`IndexFile.chunks` returns
_SEED: Final = zlib.crc32(b"loopd-es ndjson index 2")
_CHAIN: Final = struct.Struct("<I")
_RECORD: Final = struct.Struct("<qqqqqqqII")
# int64 slots of a record in the arrays :meth:`IndexFile.chunks` returns
OFFSET, LENGTH, NUMBER, VERSION, KEY, PREV, MAX_TIME, CRC = range(8)  # CRC: the low 32 bits of the slot
CHAIN: Final = 8  # in a :data:`Record` tuple


def seal(prefixes: list[bytes], chain: int) -> tuple[bytes, int]:
    """The records for ``prefixes`` (packed with :data:`PREFIX`) following a record whose chain is ``chain``
    (:func:`first_chain` for an empty index); returns (records, last chain)."""
    out = bytearray()
    pack = _CHAIN.pack
    crc = zlib.crc32
    previous = pack(chain)
    for prefix in prefixes:
        chain = crc(prefix, crc(previous, chain))
        previous = pack(chain)
        out += prefix
        out += previous
    return bytes(out), chain


def first_chain() -> int:
    return _SEED


Record = tuple[int, int, int, int, int, int, int, int, int]
"""offset, length, stream number, version, event-id key, prev, max id time, line CRC, chain"""


class IndexFile(Sidecar):
    """The position index: one record per event, in position order."""

    def __init__(self, path: Path, create: bool = True) -> None:
        self.path = path
        self.fd, self.stand_in = open_sidecar(path, create)

    def count(self) -> int:
        return os.fstat(self.fd).st_size // RECORD_SIZE

    def record(self, position: int) -> Record:
        """The record of one position (1-based); the caller checks ``position <= count()``."""
        raw = os.pread(self.fd, RECORD_SIZE, (position - 1) * RECORD_SIZE)
        return _RECORD.unpack(raw)

    def records(self, first: int, last: int) -> list[Record]:
        """Records ``first``..``last`` (positions, inclusive) in one read; fewer when the file is shorter."""
        raw = os.pread(self.fd, (last - first + 1) * RECORD_SIZE, (first - 1) * RECORD_SIZE)
        return list(_RECORD.iter_unpack(raw[: len(raw) - len(raw) % RECORD_SIZE]))

    def chain_before(self, position: int) -> int:
        """The chain value the record at ``position`` continues."""
        if position <= 1:
            return _SEED
        return self.record(position - 1)[CHAIN]

    def checked_record(self, position: int) -> Record | None:
        """The record at ``position`` if it agrees with its predecessor's chain, else None."""
        start = (position - 2) * RECORD_SIZE if position > 1 else 0
        size = (position - 1) * RECORD_SIZE + RECORD_SIZE - start
        raw = os.pread(self.fd, size, start)
        if len(raw) != size:
            return None
        before = _RECORD.unpack_from(raw, 0)[CHAIN] if position > 1 else _SEED
        mine = raw[-RECORD_SIZE:]
        rec: Record = _RECORD.unpack(mine)
        return rec if zlib.crc32(_CHAIN.pack(before) + mine[: PREFIX.size], before) == rec[CHAIN] else None

    def intact(self, count: int) -> bool:
        """Whether the first ``count`` records agree with the last one's chain: one pass at C speed."""
        if count == 0:
            return True
        crc = zlib.crc32(_CHAIN.pack(_SEED), _SEED)
        offset = 0
        end = count * RECORD_SIZE - 4
        while offset < end:
            data = os.pread(self.fd, min(1 << 24, end - offset), offset)
            if not data:
                return False
            crc = zlib.crc32(data, crc)
            offset += len(data)
        return crc == self.record(count)[CHAIN]

    def chunks(self, start: int = 0, count: int | None = None, per_chunk: int = 65536) -> list[array[int]]:
        """The records from index ``start`` (0-based), ``per_chunk`` records per array of int64 slots."""
        total = self.count() if count is None else count
        out: list[array[int]] = []
        i = start
        while i < total:
            n = min(per_chunk, total - i)
            values: array[int] = array("q")
            values.frombytes(os.pread(self.fd, n * RECORD_SIZE, i * RECORD_SIZE))
            out.append(values)
            i += n
        return out

    def matches(self, field: int, value: int, count: int) -> Iterator[tuple[array[int], int, int]]:
        """(chunk, record start, position) of every one of the first ``count`` records whose ``field`` equals ``value``.

        Searches the field's column as bytes (C speed) and keeps only 8-byte-aligned hits, so a match that
        straddles two values is never taken for one.
        """
        needle = value.to_bytes(8, "little", signed=True)
        first = 1
        for chunk in self.chunks(0, count):
            column = chunk[field::RECORD_FIELDS].tobytes()
            at = column.find(needle)
            while at != -1:
                if at % 8 == 0:
                    yield chunk, (at // 8) * RECORD_FIELDS, first + at // 8
                    at = column.find(needle, at + 8)
                else:
                    at = column.find(needle, at + 1)
            first += len(chunk) // RECORD_FIELDS

    def last_match(
        self, field: int, value: int, count: int, floor: int = 0, per_chunk: int = 8192
    ) -> tuple[int, Record] | None:
        """(position, record) of the last of records ``floor``+1..``count`` whose ``field`` equals ``value``,
        searching backwards a chunk at a time: it costs the distance from the end, not the index's size."""
        needle = value.to_bytes(8, "little", signed=True)
        end = count
        while end > floor:
            start = max(floor, end - per_chunk)
            chunk = self.chunks(start, end, per_chunk)[0]
            column = chunk[field::RECORD_FIELDS].tobytes()
            at = column.rfind(needle)
            while at != -1 and at % 8:
                at = column.rfind(needle, 0, at + 7)
            if at != -1:
                position = start + at // 8 + 1
                return position, self.record(position)
            end = start
        return None

    def append(self, records: bytes, at_count: int) -> None:
        """Write records so that they start at record ``at_count`` (cutting any torn or stale rest)."""
        offset = at_count * RECORD_SIZE
        if os.fstat(self.fd).st_size != offset:
            os.ftruncate(self.fd, offset)
        if records:
            os.pwrite(self.fd, records, offset)

    def write_at(self, records: bytes, at_count: int) -> None:
        """Write records at record ``at_count`` when the caller knows the file holds exactly that many."""
        os.pwrite(self.fd, records, at_count * RECORD_SIZE)

    def reset(self) -> None:
        os.ftruncate(self.fd, 0)

    def close(self) -> None:
        os.close(self.fd)


def line_crc(line: bytes) -> int:
    return zlib.crc32(line)
