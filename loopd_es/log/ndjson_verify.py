"""A full, read-only check of an NDJSON log file: every line, every invariant."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from ..events.envelope import ENVELOPE_DECODER
from .base import VerifyReport

_CHUNK = 1 << 20
_MAX_PROBLEMS = 20


def verify_ndjson(path: Path, fd: int, size: int) -> VerifyReport:
    """Check gapless positions, contiguous versions, unique ids, decodable lines and a complete tail."""
    report = VerifyReport(f"ndjson:{path}")
    versions: dict[str, int] = {}
    ids: dict[str, int] = {}
    offset = 0
    line_no = 0
    carry = b""
    while offset < size:
        data = os.pread(fd, min(_CHUNK, size - offset), offset)
        if not data:
            break
        data = carry + data
        offset += len(data) - len(carry)
        cut = data.rfind(b"\n") + 1
        carry = data[cut:]
        lines = data[:cut].splitlines(keepends=True)
        line_start = offset - len(data)
        for i, line in enumerate(lines):
            line_no += 1
            is_last = offset >= size and not carry and i == len(lines) - 1
            try:
                env = ENVELOPE_DECODER.decode(line)
            except msgspec.DecodeError as e:
                if is_last:
                    report.torn_offset = line_start
                    report.problems.append(
                        f"torn tail: the last line ({len(line)} bytes at byte offset {line_start}) does not "
                        f"decode ({e}); `loopd-es verify --repair` truncates it"
                    )
                else:
                    report.problems.append(f"line {line_no} of {path} (byte offset {line_start}): {e}")
                line_start += len(line)
                continue
            line_start += len(line)
            report.events += 1
            if env.position != line_no:
                report.problems.append(f"line {line_no} of {path}: position {env.position}, expected {line_no}")
            expected_version = versions.get(env.stream, 0) + 1
            if env.version != expected_version:
                report.problems.append(
                    f"line {line_no} of {path}: stream {env.stream!r} version {env.version}, "
                    f"expected {expected_version}"
                )
            versions[env.stream] = env.version
            first = ids.setdefault(env.event_id, line_no)
            if first != line_no:
                report.problems.append(f"line {line_no} of {path}: event id {env.event_id} repeats line {first}")
            if len(report.problems) >= _MAX_PROBLEMS:
                report.problems.append("... stopping after 20 problems")
                report.streams = len(versions)
                return report
    if carry:
        report.torn_offset = size - len(carry)
        report.problems.append(
            f"torn tail: {len(carry)} bytes at byte offset {size - len(carry)} have no final newline "
            "(an incomplete write); `loopd-es verify --repair` truncates them"
        )
    report.streams = len(versions)
    return report
