"""Reading lines out of an NDJSON log: chunked scans that decode many lines per call, and span reads.

Decoding is the cost of every read, so whole chunks go to msgspec's ``decode_lines`` at once; only when a
chunk does not decode is it split line by line, to name the bad line.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import msgspec

from ..errors import CorruptLogError
from ..events.envelope import ENVELOPE_DECODER, Envelope

CHUNK: Final = 1 << 20


def scan(
    path: Path, fd: int, start: int, stop: int, first_position: int
) -> Iterator[tuple[list[bytes], list[Envelope]]]:
    """Yield (lines, envelopes) of the complete lines in [start, stop), a chunk at a time.

    An incomplete or undecodable *last* line is a torn tail and is left out (``verify`` reports it
    and the next writer cuts it); any other bad line raises CorruptLogError naming the line.
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
        envs = decode_lines(path, complete, lines, offset >= stop and not carry, expected)
        del lines[len(envs) :]
        for env in envs:
            if env.position != expected:
                raise CorruptLogError(
                    str(path), expected, f"expected position {expected}, found {env.position}"
                )
            expected += 1
        yield lines, envs


def decode_lines(
    path: Path, complete: bytes, lines: list[bytes], at_end: bool, line_base: int
) -> list[Envelope]:
    """Decode ``complete`` (the bytes of ``lines``); an undecodable last line at the end of the log is dropped."""
    try:
        return ENVELOPE_DECODER.decode_lines(complete)
    except msgspec.DecodeError:
        pass
    envs: list[Envelope] = []
    for i, line in enumerate(lines):
        try:
            envs.append(ENVELOPE_DECODER.decode(line))
        except msgspec.DecodeError as e:
            if at_end and i == len(lines) - 1:
                return envs  # a torn last line: not an event yet
            raise CorruptLogError(str(path), line_base + i, str(e)) from e
    return envs


def read_spans(path: Path, fd: int, spans: list[tuple[int, int]]) -> list[Envelope]:
    """Decode the lines at ``spans`` ((offset, length) pairs), reading adjacent lines in one ``pread``."""
    parts: list[bytes] = []
    i = 0
    while i < len(spans):
        start, length = spans[i]
        end = start + length
        j = i + 1
        while j < len(spans) and spans[j][0] == end:  # coalesce adjacent lines into one read
            end += spans[j][1]
            j += 1
        parts.append(os.pread(fd, end - start, start))
        i = j
    data = b"".join(parts)
    try:
        return ENVELOPE_DECODER.decode_lines(data)
    except msgspec.DecodeError:
        envs = []
        for line in data.splitlines():
            try:
                envs.append(ENVELOPE_DECODER.decode(line))
            except msgspec.DecodeError as e:
                raise CorruptLogError(str(path), None, f"an indexed line does not decode: {e}") from e
        return envs
