"""The NDJSON backend's coordination records (:mod:`.coord`): one small JSON file beside the log.

``events.ndjson.coord`` maps each key to its record. It is only ever replaced whole (written to a temporary
file, synced, renamed over, the directory synced), and only by a writer holding the log's ``flock``, the same
lock a fenced append checks its fences under, so readers need no lock and a fence check and a takeover never
interleave. The file is read again only when it changed (its inode, size or modification time).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import msgspec

from ..errors import CorruptLogError, StoreUnavailableError
from .coord import CLAIMS_DECODER, CLAIMS_ENCODER, Claim

if TYPE_CHECKING:
    from pathlib import Path


class CoordFile:
    """The coordination file of one log, with the last version read cached."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[int, int, int] | None = None
        self._records: dict[str, Claim] = {}

    def load(self) -> dict[str, Claim]:
        """The records as the file holds them now (a copy the caller may change).

        :raises CorruptLogError: when the file is not a map of records.
        :raises StoreUnavailableError: when it cannot be read.
        """
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._seen, self._records = None, {}
            return {}
        except OSError as e:
            raise StoreUnavailableError(f"cannot read {self.path}: {e.strerror}") from e
        seen = (st.st_ino, st.st_size, st.st_mtime_ns)
        if seen != self._seen:
            try:
                data = self.path.read_bytes()
                self._records = CLAIMS_DECODER.decode(data) if data else {}
            except OSError as e:
                raise StoreUnavailableError(f"cannot read {self.path}: {e.strerror}") from e
            except msgspec.DecodeError as e:
                raise CorruptLogError(
                    str(self.path),
                    None,
                    f"the coordination file is damaged ({e}); stop every engine and delete it",
                ) from e
            self._seen = seen
        return dict(self._records)

    def store(self, records: dict[str, Claim]) -> None:
        """Replace the file with ``records`` durably (the caller holds the log's writer lock).

        :raises StoreUnavailableError: when it cannot be written; the old file is then unchanged.
        """
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, CLAIMS_ENCODER.encode(dict(sorted(records.items()))))
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as e:
            raise StoreUnavailableError(
                f"cannot write {self.path}: {e.strerror}; the coordination records are unchanged"
            ) from e
        self._records = dict(records)
        st = os.stat(self.path)
        self._seen = (st.st_ino, st.st_size, st.st_mtime_ns)
