"""The ledger as one byte string across rotation: ``events.ndjson.N`` ... ``events.ndjson.1``, then ``events.ndjson``.

opencode-loopd never rotates its ledger itself, so an operator whose ledger has grown large may rotate it
(``logrotate`` without ``copytruncate``, or by hand): the current file is renamed to ``events.ndjson.1``,
older ones move up a number, and loopd's next append (``fs.appendFile``) creates a fresh ``events.ndjson``. Read in that order the segments are the one ledger, so a line keeps the same number
(``ledger:<line>``) before and after a rotation, which is what lets a mirror that was stopped across a
rotation resume without gaps or duplicates. The rotated segments must be kept: dropping the oldest
renumbers every line after it. ``copytruncate`` is not supported: between its copy and its truncation the
same lines are in two segments.

A rotation can happen while we read, so the segment list is taken twice (names and inodes) around the
read and the read is retried until it is the same; a missing number in the sequence (``.2`` but no ``.1``)
is a rotation half done and is read again too.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Final

_ATTEMPTS: Final = 20
_SEGMENT: Final = re.compile(r"\.(\d+)$")


def rotated(path: Path) -> list[Path]:
    """The rotated segments of ``path``, oldest first (``.3``, ``.2``, ``.1``)."""
    numbered: list[tuple[int, Path]] = []
    prefix = path.name + "."
    try:
        names = os.listdir(path.parent)
    except FileNotFoundError:
        return []
    for name in names:
        if name.startswith(prefix):
            m = _SEGMENT.search(name[len(path.name) :])
            if m is not None and m.group(0) == name[len(path.name) :]:
                numbered.append((int(m.group(1)), path.with_name(name)))
    numbered.sort(reverse=True)
    return [p for _, p in numbered]


def _listing(path: Path) -> tuple[tuple[str, int, int], ...] | None:
    """Names, inodes and sizes of the segments and the current file; None while a rotation is half done."""
    files = [*rotated(path), path]
    numbers = [int(p.name.rsplit(".", 1)[1]) for p in files[:-1]]
    if numbers and sorted(numbers) != list(range(1, len(numbers) + 1)):
        return None
    out: list[tuple[str, int, int]] = []
    for p in files:
        try:
            st = p.stat()
        except FileNotFoundError:
            if p == path:
                continue  # renamed away, not yet recreated: an empty current segment
            return None
        out.append((p.name, st.st_ino, st.st_size))
    return tuple(out)


def read_ledger_bytes(path: Path) -> bytes:
    """The whole ledger: rotated segments oldest first, then ``path``; each segment ends with a newline.

    A segment that does not end with a newline was cut mid-line before it was rotated; its last line is
    closed so it cannot merge with the next segment's first (a complete-looking damaged line is then
    reported as not JSON, naming its line). Raises ``FileNotFoundError`` when there is no ledger at all.

    :raises OSError: when a segment cannot be read.
    """
    for _ in range(_ATTEMPTS):
        before = _listing(path)
        if before is None:
            continue
        segments = [path.with_name(name) for name, _ino, _size in before]
        if not segments:
            raise FileNotFoundError(path)
        try:
            parts = [p.read_bytes() for p in segments]
        except FileNotFoundError:
            continue
        if _same_files(before, _listing(path)):
            return b"".join(_closed(part) if i < len(parts) - 1 else part for i, part in enumerate(parts))
    raise OSError(f"the ledger kept rotating while it was read ({_ATTEMPTS} attempts)")


def _same_files(
    before: tuple[tuple[str, int, int], ...], after: tuple[tuple[str, int, int], ...] | None
) -> bool:
    """Same names on the same inodes (sizes may grow: an append after the read is read next time)."""
    return after is not None and [(n, i) for n, i, _ in before] == [(n, i) for n, i, _ in after]


def _closed(part: bytes) -> bytes:
    return part if not part or part.endswith(b"\n") else part + b"\n"
