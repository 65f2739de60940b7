"""Where a log's read database lives by default; no import beyond the URL parsers (every query needs it)."""

from __future__ import annotations

from pathlib import Path

from ..log import POSTGRES_SCHEMES, parse_store_url
from ..log.postgres_url import split_postgres_url


def default_read_db(store_url: str) -> Path:
    """``read.db`` in the log's directory: ``sqlite:.loopd/events.db`` -> ``.loopd/read.db``.

    A log on a database server keeps its read models on this machine: ``.loopd/read-<schema>.db``.
    """
    if store_url.startswith(POSTGRES_SCHEMES):
        return Path(".loopd") / f"read-{split_postgres_url(store_url)[1]}.db"
    _, path, _ = parse_store_url(store_url)
    return Path(path).parent / "read.db"
