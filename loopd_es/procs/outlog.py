"""The per-command output log: raw bytes in ``commands/<id>.log``, bounded, never in the event log.

The reference rewrites the file to its last 512 KiB after every chunk beyond the limit; that costs a
512 KiB copy per chunk while a child floods. Here the file may grow 128 KiB past the limit before it is
cut back, and every reader looks only at its last 512 KiB, so what a user sees is the same bound.

Writes are plain synchronous ``os.write`` calls: a page-cache write of one PTY chunk costs microseconds,
far less than the thread hop an async file API would add per chunk.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Final

import msgspec

from ..domain.command import MAX_AWAIT_TAIL_BYTES, MAX_OUTPUT_BYTES, OutputFacts, cap_utf8
from ..private_files import PRIVATE_FILE
from .text import clean_line, sanitize, split_lines, strip_ansi

if TYPE_CHECKING:
    from ..patterns import UserPattern

SLACK_BYTES: Final = 128 * 1024
READ_DEFAULT_BYTES: Final = 64 * 1024
READ_MAX_BYTES: Final = 256 * 1024
MAX_READ_LINES: Final = 500


class OutputLog:
    """The owner's append handle on one command's log file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.size = os.fstat(self._fd).st_size
        self.stream_bytes = self.size

    def append(self, data: bytes) -> None:
        os.write(self._fd, data)
        self.size += len(data)
        self.stream_bytes += len(data)
        if self.size > MAX_OUTPUT_BYTES + SLACK_BYTES:
            self._cut()

    def _cut(self) -> None:
        keep = retained_bytes(self.path)
        tmp = self.path.with_suffix(".log.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, PRIVATE_FILE)
        try:  # 0600 like the log it replaces (write_bytes followed the umask: 0644 past the first cut)
            os.write(fd, keep)
        finally:
            os.close(fd)
        os.chmod(tmp, PRIVATE_FILE)  # a .tmp left by a crash keeps its old mode through O_CREAT
        os.replace(tmp, self.path)
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self.size = len(keep)

    def facts(self) -> OutputFacts:
        retained = min(self.size, MAX_OUTPUT_BYTES)
        return OutputFacts(
            output_bytes=retained,
            stream_bytes=self.stream_bytes,
            truncated=self.stream_bytes > retained,
            tail=tail_text(self.path),
        )

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def retained_bytes(path: Path) -> bytes:
    """The last 512 KiB of the log (``b""`` when there is no log)."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - MAX_OUTPUT_BYTES))
            return f.read()
    except FileNotFoundError:
        return b""


def tail_text(path: Path, limit: int = MAX_AWAIT_TAIL_BYTES) -> str:
    """The sanitised end of the log, at most ``limit`` UTF-8 bytes (await and exit evidence)."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - 4 * limit))
            data = f.read()
    except FileNotFoundError:
        return ""
    return cap_utf8(sanitize(data.decode("utf-8", "replace")), limit)


def stored_facts(path: Path, stream_bytes: int | None = None) -> OutputFacts:
    """Output facts read from the file alone (when no owner is alive to tell the lifetime byte count)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        size = 0
    retained = min(size, MAX_OUTPUT_BYTES)
    total = max(size, stream_bytes or 0)
    return OutputFacts(
        output_bytes=retained, stream_bytes=total, truncated=total > retained, tail=tail_text(path)
    )


class ReadResult(msgspec.Struct, frozen=True, kw_only=True):
    """A page of output: raw text (plain read) or matching original lines (pattern read)."""

    text: str
    offset: int
    next_offset: int
    retained: int
    total_matches: int | None = None


def read_plain(path: Path, offset: int | None, limit: int | None) -> ReadResult:
    """Bytes of the retained log: from ``offset`` (0 = oldest retained), or the last ``limit`` bytes."""
    data = retained_bytes(path)
    size = min(READ_MAX_BYTES, limit or READ_DEFAULT_BYTES)
    start = max(0, len(data) - size) if offset is None else min(max(0, offset), len(data))
    chunk = data[start : start + size]
    return ReadResult(
        text=chunk.decode("utf-8", "replace"),
        offset=start,
        next_offset=start + len(chunk),
        retained=len(data),
    )


def matching_lines(data: bytes, pattern: UserPattern) -> list[str]:
    """Original lines of ``data`` whose ANSI-stripped text matches ``pattern``."""
    return [line for line in split_lines(data) if pattern.search(clean_line(line))]


def read_pattern(path: Path, pattern: UserPattern, skip: int | None, limit: int | None) -> ReadResult:
    """Matching lines of the retained log: ``skip`` matches, then at most ``limit`` (≤ 500)."""
    data = retained_bytes(path)
    found = matching_lines(data, pattern)
    first = max(0, skip or 0)
    count = min(MAX_READ_LINES, limit or MAX_READ_LINES)
    page = found[first : first + count]
    return ReadResult(
        text="\n".join(page),
        offset=first,
        next_offset=first + len(page),
        retained=len(data),
        total_matches=len(found),
    )


def until_matches(path: Path, pattern: UserPattern) -> list[str]:
    """Clean non-blank lines of the retained log matching an until pattern (for immediate await fires)."""
    out = []
    for line in split_lines(retained_bytes(path)):
        text = clean_line(line)
        if text.strip() and pattern.search(text):
            out.append(strip_ansi(text))
    return out
