"""The files a file-backed log is made of, so a command that made a new log can take it back whole.

``export``/``import`` into a new log must leave nothing behind when they fail: :class:`NewFiles` notes which of
the target's files did not exist before the command opened it and removes exactly those (never a file that was
there before). A server log (PostgreSQL) or a memory log has no files here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from . import POSTGRES_SCHEMES, parse_store_url

NDJSON_SIDECARS: Final = (".lock", ".idx", ".streams", ".heads", ".coord", ".coord.tmp")
"""Beside ``events.ndjson``: see :mod:`.ndjson_files` and :mod:`.ndjson_coord`."""
SQLITE_SIDECARS: Final = ("-wal", "-shm", "-journal")


def log_files(url: str) -> tuple[Path, ...]:
    """The log file at ``url`` and every sidecar its backend may write beside it; () for other backends."""
    if url.strip().startswith(POSTGRES_SCHEMES):
        return ()
    scheme, path, _ = parse_store_url(url)
    sidecars = {"ndjson": NDJSON_SIDECARS, "sqlite": SQLITE_SIDECARS}.get(scheme)
    if sidecars is None:
        return ()
    log = Path(path)
    return (log, *(log.with_name(log.name + suffix) for suffix in sidecars))


class NewFiles:
    """The files of the log at ``url`` when there is no log file there yet (noted before the log is opened);
    none when the log file exists: its sidecars may be another process's (an SQLite ``-wal`` in use)."""

    def __init__(self, url: str) -> None:
        files = log_files(url)
        new = bool(files) and not (files[0].exists() or files[0].is_symlink())
        self.paths = [p for p in files if not (p.exists() or p.is_symlink())] if new else []

    def remove(self) -> None:
        """Remove what was made since (best effort: a file that cannot be removed stays)."""
        for path in self.paths:
            try:
                path.unlink(missing_ok=True)
            except OSError:
                pass
