"""Where a log's read database lives by default; no import beyond the URL parsers (every query needs it)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from urllib.parse import urlsplit

from ..log import POSTGRES_SCHEMES, parse_store_url
from ..log.postgres_url import public_url, split_postgres_url


def default_read_db(store_url: str) -> Path:
    """The read database beside the log: ``.loopd/read.db`` for the default logs (``events.db``,
    ``events.ndjson``), ``NAME.read.db`` beside any other log file ``NAME``, so two logs in one directory never
    share one (it would refuse the second log: built from another).

    A log on a database server keeps its read models on this machine: ``.loopd/read-<schema>-<server>.db``,
    ``<server>`` eight hex digits of the server and database (without user or password), so two databases'
    logs in one directory do not share one either.
    """
    if store_url.startswith(POSTGRES_SCHEMES):
        conninfo, schema = split_postgres_url(store_url)
        parts = urlsplit(public_url(conninfo))
        where = f"{parts.netloc.rsplit('@', 1)[-1]}{parts.path}?{parts.query}"
        return Path(".loopd") / f"read-{schema}-{hashlib.sha256(where.encode()).hexdigest()[:8]}.db"
    _, path, _ = parse_store_url(store_url)
    log = Path(path)
    return log.parent / ("read.db" if log.name in _DEFAULT_LOGS else f"{log.name}.read.db")


_DEFAULT_LOGS = frozenset({"events.db", "events.ndjson"})
