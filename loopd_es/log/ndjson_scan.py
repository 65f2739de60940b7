"""Reading lines out of an NDJSON log: where the committed lines end, chunked scans, span reads.

Every write ends with a line ending ``}\\n``; the other lines of a multi-event write end ``} \\n`` (a space,
which is JSON whitespace: the file stays one JSON object per line). So the log's own bytes say where the
last whole write ends: after the last ``}\\n``. What follows it can only be an unfinished write (lines
ending ``} \\n`` and/or a line with no newline yet), never acknowledged, so it may be hidden and cut. A
complete line that ends any other way, or a committed line that does not decode, is damage: it is reported
with its line number and never cut.

Decoding is the cost of every read, so whole chunks go to msgspec's ``decode_lines`` at once; only when a
chunk does not decode is it split line by line, to name the bad line.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import msgspec

from ..errors import CorruptLogError
from ..events.envelope import ENVELOPE_DECODER, Envelope

CHUNK: Final = 1 << 20
_BACK: Final = 1 << 16
END_OF_WRITE: Final = b"}\n"

class IndexMismatch(CorruptLogError):
    """An index record points at a line of another position: the index, not the log, is wrong."""


Span = tuple[int, int, int, int]
"""offset, length, line CRC, position of one indexed line"""


def settle(path: Path, fd: int, start: int, stop: int, first_position: int) -> int:
    """The end of the whole writes in [start, stop): just after the last ``}\\n`` (``start`` if none).

    :raises CorruptLogError: when a complete line after that point does not end with ``} \\n`` (damage, not
        an unfinished write).
    """
    settled = last_write_end(fd, start, stop)
    if settled < stop:
        rest = os.pread(fd, stop - settled, settled)
        at = rest.find(b"\n")
        while at >= 0:
            if at == 0 or rest[at - 1 : at] != b" ":
                line = first_position + _count_lines(fd, start, settled) + rest.count(b"\n", 0, at)
                raise CorruptLogError(
                    str(path), line, f"a complete line (byte offset {settled}) does not end an event: damaged"
                )
            at = rest.find(b"\n", at + 1)
    return settled


def last_write_end(fd: int, start: int, stop: int) -> int:
    """Just after the last ``}\n`` in [start, stop), or ``start`` when there is none."""
    hi = stop
    while hi > start:
        lo = max(start, hi - _BACK)
        data = os.pread(fd, min(hi + 1, stop) - lo, lo)  # one byte of overlap: a "}\n" across chunks
        at = data.rfind(END_OF_WRITE)
        if at >= 0:
            return lo + at + 2
        hi = lo
    return start


def _count_lines(fd: int, start: int, stop: int) -> int:
    count = 0
    while start < stop:
        data = os.pread(fd, min(CHUNK, stop - start), start)
        if not data:
            break
        count += data.count(b"\n")
        start += len(data)
    return count


def scan(
    path: Path, fd: int, start: int, stop: int, first_position: int
) -> Iterator[tuple[list[bytes], list[Envelope]]]:
    """Yield (lines, envelopes) of the lines in [start, stop), a chunk at a time; ``stop`` is a settled end.

    :raises CorruptLogError: naming the line, for a line that does not decode or is out of position.
    """
    expected = first_position
    offset = start
    carry = b""
    while offset < stop:
        data = os.pread(fd, min(CHUNK, stop - offset), offset)
        if not data:
            break
        offset += len(data)
        data = carry + data if carry else data
        cut = data.rfind(b"\n") + 1
        complete, carry = data[:cut], data[cut:]
        if not complete:
            continue
        lines = complete.splitlines(keepends=True)
        envs = decode_lines(path, complete, lines, expected)
        for env in envs:
            if env.position != expected:
                raise CorruptLogError(str(path), expected, f"expected position {expected}, found {env.position}")
            expected += 1
        yield lines, envs


def decode_lines(path: Path, complete: bytes, lines: list[bytes], line_base: int) -> list[Envelope]:
    """Decode ``complete`` (the bytes of ``lines``, the first being line ``line_base``)."""
    try:
        return ENVELOPE_DECODER.decode_lines(complete)
    except msgspec.DecodeError:
        pass
    envs: list[Envelope] = []
    for i, line in enumerate(lines):
        try:
            envs.append(ENVELOPE_DECODER.decode(line))
        except msgspec.DecodeError as e:
            raise CorruptLogError(str(path), line_base + i, f"the line does not decode: {e}") from e
    return envs


def body_crc(line: bytes) -> int:
    """The checksum the index keeps of a line: CRC-32 of its JSON object, without the line ending."""
    return zlib.crc32(line.rstrip(b" \n"))


def read_spans(path: Path, fd: int, spans: list[Span]) -> list[Envelope]:
    """Decode the lines at ``spans``, reading adjacent lines in one ``pread``, and check each against its
    index record: its position and the checksum of its bytes.

    :raises CorruptLogError: naming the position, for a line that does not decode or does not match its
        checksum.
    :raises IndexMismatch: when a line is whole but of another position than its record says.
    """
    parts: list[bytes] = []
    i = 0
    while i < len(spans):
        start, length = spans[i][0], spans[i][1]
        end = start + length
        j = i + 1
        while j < len(spans) and spans[j][0] == end:  # coalesce adjacent lines into one read
            end += spans[j][1]
            j += 1
        parts.append(os.pread(fd, end - start, start))
        i = j
    data = b"".join(parts)
    at = 0
    crc = zlib.crc32
    for _offset, length, line_crc, position in spans:
        if crc(data[at : at + length].rstrip(b" \n")) != line_crc:
            raise CorruptLogError(
                str(path), position, "the line does not match its checksum: it was changed after it was written"
            )
        at += length
    try:
        envs = ENVELOPE_DECODER.decode_lines(data)
    except msgspec.DecodeError as e:
        raise CorruptLogError(str(path), None, f"an indexed line does not decode: {e}") from e
    for env, span in zip(envs, spans, strict=True):
        if env.position != span[3]:
            raise IndexMismatch(str(path), span[3], f"the index record points at position {env.position}")
    return envs
