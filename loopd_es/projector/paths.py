"""Where a log's read database lives by default; no import beyond the URL parsers (every query needs it)."""

from __future__ import annotations

from pathlib import Path

from ..log import POSTGRES_SCHEMES, parse_store_url
from ..log.postgres_url import split_postgres_url


def default_read_db(store_url: str) -> Path:
    """The read database beside the log: ``.loopd/read.db`` for the default logs (``events.db``,
    ``events.ndjson``), ``NAME.read.db`` beside any other log file ``NAME``, so two logs in one directory never
    share one (it would refuse the second log: built from another).

    A log on a database server keeps its read models on this machine: ``.loopd/read-<schema>.db``.
    """
    if store_url.startswith(POSTGRES_SCHEMES):
        return Path(".loopd") / f"read-{split_postgres_url(store_url)[1]}.db"
    _, path, _ = parse_store_url(store_url)
    log = Path(path)
    return log.parent / ("read.db" if log.name in _DEFAULT_LOGS else f"{log.name}.read.db")


_DEFAULT_LOGS = frozenset({"events.db", "events.ndjson"})
