"""A full, read-only check of an NDJSON log file: every line, every invariant, every checksum.

It checks what ``read`` shows and says what it leaves out: writes not yet synced (past the durable end the
lock file records), an unfinished write after the last whole one, a damaged line.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterator
from pathlib import Path

import msgspec

from ..events.envelope import ENVELOPE_DECODER
from .invariants import VerifyReport
from .ndjson_index import CRC, RECORD_FIELDS, IndexFile
from .ndjson_scan import CHUNK, body_crc, last_write_end

_MAX_PROBLEMS = 20
_CHANGED = "does not match its checksum"


def changed_lines(report: VerifyReport) -> int:
    """How many lines ``report`` found changed after they were written (their index checksum differs)."""
    return sum(_CHANGED in problem for problem in report.problems)


def verify_ndjson(path: Path, fd: int, size: int, synced: int | None, index: IndexFile) -> VerifyReport:
    """Check gapless positions, contiguous versions, unique ids, decodable lines, checksums, a whole tail.

    ``synced`` is the durable end the lock file records (None: all of the file); what lies past it is
    reported, not counted, as ``read`` does not show it.
    """
    report = VerifyReport(f"ndjson:{path}")
    end = size
    if synced is not None and synced > size:
        report.problems.append(
            f"{path} ends at byte {size}, but its writers acknowledged it up to byte {synced}: acknowledged "
            "events were cut from it; restore it from a copy, or `loopd-es verify --repair` accepts it as it is"
        )
    elif synced is not None and synced < size:
        end = synced
        report.problems.append(
            f"{size - end} bytes at byte offset {end} are written but not yet synced by their writer (it is "
            "syncing them, or it died first): `loopd-es read` does not show them until a later append or "
            "`loopd-es verify --repair` syncs them"
        )
    committed = last_write_end(fd, 0, size)
    crcs = _index_checksums(path, index, report)
    versions: dict[str, int] = {}
    ids: dict[str, int] = {}
    line_no = 0
    for line_start, line in _lines(fd, committed):
        line_no += 1
        try:
            env = ENVELOPE_DECODER.decode(line)
        except msgspec.DecodeError as e:
            report.problems.append(
                f"line {line_no} of {path} (byte offset {line_start}) does not decode: {e}"
            )
            continue
        if line_start >= end:
            continue  # written, not yet synced: reported above, not counted
        report.events += 1
        if crcs is not None and line_no <= len(crcs) and (crcs[line_no - 1] & 0xFFFFFFFF) != body_crc(line):
            report.problems.append(
                f"line {line_no} of {path} {_CHANGED}: it was changed after it was written"
            )
        if env.position != line_no:
            report.problems.append(f"line {line_no} of {path}: position {env.position}, expected {line_no}")
        expected_version = versions.get(env.stream, 0) + 1
        if env.version != expected_version:
            report.problems.append(
                f"line {line_no} of {path}: stream {env.stream!r} version {env.version}, expected {expected_version}"
            )
        versions[env.stream] = env.version
        first = ids.setdefault(env.event_id, line_no)
        if first != line_no:
            report.problems.append(f"line {line_no} of {path}: event id {env.event_id} repeats line {first}")
        if len(report.problems) >= _MAX_PROBLEMS:
            report.problems.append("... stopping after 20 problems")
            break
    else:
        if crcs is not None and len(crcs) > line_no and end == size:
            report.problems.append(
                f"the index records {len(crcs)} events but {path} holds {line_no}: events were lost"
            )
        _check_rest(path, fd, committed, size, line_no, report, cut=synced is not None and synced > size)
    report.streams = len(versions)
    return report


def _check_rest(
    path: Path, fd: int, committed: int, end: int, lines: int, report: VerifyReport, *, cut: bool = False
) -> None:
    """What follows the last whole write: an unfinished write (reported, cut by a repair) or damage; with
    ``cut`` (the log ends before its acknowledged end), what is left of an event cut from it."""
    if committed >= end:
        return
    rest = os.pread(fd, end - committed, committed)
    at = rest.find(b"\n")
    while at >= 0:
        if at == 0 or rest[at - 1 : at] != b" ":
            line = lines + 1 + rest.count(b"\n", 0, at)
            report.problems.append(
                f"line {line} of {path} is complete but does not end an event: "
                "damaged (never cut: restore it from a copy)"
            )
            return
        at = rest.find(b"\n", at + 1)
    report.torn_offset = committed
    whole = rest.count(b"\n")
    if cut:
        report.problems.append(
            f"{len(rest)} bytes at byte offset {committed} are what is left of acknowledged events cut from the "
            "log; `loopd-es verify --repair` removes them"
        )
        return
    report.problems.append(
        f"an unfinished write: {len(rest)} bytes at byte offset {committed} ({whole} whole lines "
        "of a batch whose last line never came), never acknowledged; `loopd-es read` does not show it; "
        "`loopd-es verify --repair` removes it"
    )


def _index_checksums(path: Path, index: IndexFile, report: VerifyReport) -> array[int] | None:
    """The index's line-checksum slots (CRC in the low 32 bits), or None when the index fails its own check."""
    count = index.count()
    if not index.intact(count):
        report.problems.append(
            f"the index {path.name}.idx fails its checksum (records edited, reordered or torn), so the events' "
            "checksums cannot be checked; `loopd-es verify --repair` rebuilds it from the log"
        )
        return None
    out: array[int] = array("q")
    for chunk in index.chunks(0, count):
        out.extend(chunk[CRC::RECORD_FIELDS])
    return out


def _lines(fd: int, stop: int) -> Iterator[tuple[int, bytes]]:
    """(byte offset, line) of every line in [0, stop), a chunk at a time; ``stop`` ends a line."""
    offset = 0
    carry = b""
    while offset < stop:
        data = os.pread(fd, min(CHUNK, stop - offset), offset)
        if not data:
            return
        start = offset - len(carry)
        offset += len(data)
        data = carry + data if carry else data
        cut = data.rfind(b"\n") + 1
        carry = data[cut:]
        for line in data[:cut].splitlines(keepends=True):
            yield start, line
            start += len(line)
