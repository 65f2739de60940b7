"""Refusing to touch a file that is not a loopd-es NDJSON log (``--store ndjson:notes.txt``)."""

from __future__ import annotations

from pathlib import Path
from typing import Final

import msgspec

from ..errors import StoreUnavailableError
from ..events.envelope import ENVELOPE_DECODER

_START: Final = b'{"position":1,'
_FIRST_LINE_MAX: Final = 1 << 24


def check_is_log(path: Path) -> None:
    """Pass for a missing or empty file and for one whose first line is (the start of) event 1.

    A log this package wrote starts with ``{"position":1,``; a first line written otherwise passes when it
    decodes as the envelope of position 1. Runs before anything is created next to the file.

    :raises StoreUnavailableError: for anything else, touching nothing.
    """
    try:
        with path.open("rb") as f:
            head = f.read(len(_START))
            if not head or head == _START or (len(head) < len(_START) and _START.startswith(head)):
                return
            first = head + (f.readline(_FIRST_LINE_MAX) if not head.endswith(b"\n") else b"")
    except FileNotFoundError:
        return
    except OSError as e:
        raise StoreUnavailableError(f"cannot read {path}: {e.strerror}; check --store and permissions") from e
    try:
        if ENVELOPE_DECODER.decode(first).position == 1:
            return
    except msgspec.DecodeError:
        pass
    raise StoreUnavailableError(
        f"{path} is not a loopd-es log (its first line is not event 1); refusing to touch it: "
        "pick another --store path"
    )


