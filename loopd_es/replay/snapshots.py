"""Snapshots: a folded stream state saved beside the log so a long stream need not be folded from 1.

A snapshot is a cache, never a source of truth: it is keyed by the reducer's version and by a fingerprint
of the event catalogue (every type and schema version), and a key that does not match the running code is
discarded, never read. Files live in ``<log path>.snapshots/<key>/``, one per stream, written to a
temporary file and renamed, so a crash leaves the old snapshot or the new one, never half of either.
Reads and writes are small synchronous file operations (one file of a few KiB per stream).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import urllib.parse
from pathlib import Path
from typing import Any, Final

import msgspec

from ..events.base import CATALOGUE
from ..private_files import PRIVATE_FILE, make_private_dir

DEFAULT_EVERY: Final = 500
"""Save a stream's snapshot once it is this many events past the last one."""


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    """A stream's state after its event ``version`` (global ``position``, recorded at ``recorded_at``)."""

    stream: str
    version: int
    position: int
    recorded_at: str
    state: msgspec.Raw


def catalogue_fingerprint() -> str:
    """A short hash of every event type and its schema version: it changes when any payload version does."""
    text = ";".join(f"{t}={CATALOGUE[t].schema_version}" for t in sorted(CATALOGUE))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


class SnapshotStore:
    """Snapshots of one log, under ``root``, for the reducer versions in ``key``."""

    def __init__(self, root: Path, reducer_versions: dict[str, int], every: int = DEFAULT_EVERY) -> None:
        self.root = root
        self.every = every
        parts = "-".join(f"{k}{v}" for k, v in sorted(reducer_versions.items()))
        self.key = f"{parts}-c{catalogue_fingerprint()}"
        self.dir = root / self.key
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(Snapshot)

    @classmethod
    def beside(
        cls, log_path: str | Path, reducer_versions: dict[str, int], every: int = DEFAULT_EVERY
    ) -> SnapshotStore:
        """The snapshot store of the log at ``log_path`` (``events.db`` -> ``events.db.snapshots/``)."""
        path = Path(log_path)
        return cls(path.with_name(path.name + ".snapshots"), reducer_versions, every)

    def discard_stale(self) -> list[str]:
        """Remove snapshots written by other reducer or catalogue versions; returns the removed keys."""
        removed = []
        if self.root.is_dir():
            for child in self.root.iterdir():
                if child.is_dir() and child.name != self.key:
                    shutil.rmtree(child, ignore_errors=True)
                    removed.append(child.name)
        return removed

    def _file(self, stream: str) -> Path:
        return self.dir / (urllib.parse.quote(stream, safe="") + ".snap")

    def load(self, stream: str) -> Snapshot | None:
        """The stream's snapshot, or ``None`` (missing or unreadable: a cache miss, never an error)."""
        try:
            return self._decoder.decode(self._file(stream).read_bytes())
        except (OSError, msgspec.DecodeError):
            return None

    def save(self, stream: str, version: int, position: int, recorded_at: str, state: Any) -> None:
        """Write the stream's snapshot atomically (best effort: a failed write is only a missed cache)."""
        snap = Snapshot(
            stream=stream,
            version=version,
            position=position,
            recorded_at=recorded_at,
            state=msgspec.Raw(self._encoder.encode(state)),
        )
        target = self._file(stream)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            make_private_dir(self.dir)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, PRIVATE_FILE)
            with os.fdopen(fd, "wb") as out:
                out.write(self._encoder.encode(snap))
            os.replace(tmp, target)
        except OSError:
            tmp.unlink(missing_ok=True)
