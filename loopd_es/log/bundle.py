"""A goal bundle as a read-only log: ``--store bundle:goal.bundle``.

A bundle (``loopd-es bundle``) is one UTF-8 file: a header line (a JSON object: what the bundle holds, its
redaction report and the goal's HTML timeline), then one envelope per line, in global order. Its events are a
subset of a log, renumbered 1, 2, 3 ... so the bundle keeps the log's invariants (gapless positions,
contiguous stream versions: a bundle holds whole streams); event ids, links and times are the original's.

Opened, it keeps every read of the log contract (it is a memory log loaded from the file) and refuses every
write with one line: a bundle is shared as it was made.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal

import msgspec

from ..errors import CorruptLogError, LogNotFoundError, StoreUnavailableError, UsageError
from ..events.envelope import Envelope
from .invariants import SequenceChecker
from .memory import MemoryLog, _Shared

if TYPE_CHECKING:
    from .coord import Claim
    from .group_commit import Request

FORMAT: Final = "loopd-es-bundle"
BUNDLE_HINT: Final = "write the bundle first: `loopd-es bundle GOAL -o FILE` (a bundle is never appended to)"


class BundleHeader(msgspec.Struct, kw_only=True):
    """The first line of a bundle."""

    format: Literal["loopd-es-bundle"] = FORMAT
    version: int = 1
    goal_id: str
    created_at: str
    events: int
    streams: tuple[str, ...]
    redaction: dict[str, Any] = {}
    timeline_html: str = ""


class ReadOnlyLogError(UsageError):
    """Raised when something tries to write to a log that is read-only (a bundle)."""

    def __init__(self, url: str, what: str) -> None:
        super().__init__(
            f"{url} is a read-only bundle: cannot {what} (copy it into a log first: "
            f"`loopd-es --store {url} export --to sqlite:goal.db`)"
        )


_ENVELOPE: Final = msgspec.json.Decoder(Envelope)
_HEADER: Final = msgspec.json.Decoder(BundleHeader)
_ENCODER: Final = msgspec.json.Encoder()


def write_bundle(path: Path, header: BundleHeader, envelopes: Iterable[Envelope]) -> int:
    """Write the bundle whole, then rename it into place (a reader never sees half a bundle); its size.

    :raises StoreUnavailableError: when the file cannot be written.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as out:
            out.write(_ENCODER.encode(header) + b"\n")
            for env in envelopes:
                out.write(_ENCODER.encode(env) + b"\n")
            out.flush()
            os.fsync(out.fileno())
            size = out.tell()
        tmp.replace(path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise StoreUnavailableError(f"cannot write the bundle {path}: {e.strerror}") from None
    return size


def read_bundle(path: Path) -> tuple[BundleHeader, list[Envelope]]:
    """The header and the envelopes of the bundle at ``path``.

    :raises LogNotFoundError: when there is no such file.
    :raises CorruptLogError: when it is not a bundle, or a line does not decode or breaks the log's order.
    """
    where = f"bundle:{path}"
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise LogNotFoundError(where, BUNDLE_HINT) from None
    except OSError as e:
        raise StoreUnavailableError(f"cannot read {where}: {e.strerror}") from None
    lines = raw.splitlines()
    if not lines:
        raise CorruptLogError(where, 1, "empty file: not a loopd-es bundle")
    try:
        header = _HEADER.decode(lines[0])
    except msgspec.DecodeError as e:
        raise CorruptLogError(where, 1, f"not a loopd-es bundle header: {e}") from None
    checker = SequenceChecker(where)
    envelopes = []
    for number, line in enumerate(lines[1:], 2):
        try:
            env = _ENVELOPE.decode(line)
        except msgspec.DecodeError as e:
            raise CorruptLogError(where, number, str(e)) from None
        checker.check(env)
        envelopes.append(env)
    if len(envelopes) != header.events:
        raise CorruptLogError(
            where, None, f"the header says {header.events} events, the file holds {len(envelopes)}"
        )
    return header, envelopes


class BundleLog(MemoryLog):
    """A bundle file, loaded into memory and served read-only."""

    read_only: ClassVar[bool] = True

    def __init__(self, path: Path, header: BundleHeader, envelopes: list[Envelope]) -> None:
        self.url = f"bundle:{path}"
        self.header = header
        self._log = _Shared()
        self._closed = False
        self._record(envelopes)

    @classmethod
    async def open_bundle(cls, path: Path) -> BundleLog:
        """Load the bundle at ``path``; see :func:`read_bundle` for the errors."""
        import anyio.to_thread

        header, envelopes = await anyio.to_thread.run_sync(read_bundle, path)
        return cls(path, header, envelopes)

    async def _submit(self, request: Request) -> list[Envelope]:
        raise ReadOnlyLogError(self.url, "append events")

    async def coord_swap(self, key: str, expected_token: int, new: Claim | None) -> Claim | None:
        raise ReadOnlyLogError(self.url, "take a lease or claim")

    async def import_envelopes(self, batches: AsyncIterator[list[Envelope]]) -> int:
        raise ReadOnlyLogError(self.url, "import into it")
