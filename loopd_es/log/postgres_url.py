"""A PostgreSQL store URL: its libpq part and its schema, and the form of it that messages show.

Apart from :mod:`.postgres` so that what only needs the schema of a URL (a read database's or a command log's
path) does not load psycopg.
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..errors import UsageError

_SCHEMA_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def split_postgres_url(url: str) -> tuple[str, str]:
    """Split a store URL into (libpq conninfo URL, schema name).

    :raises UsageError: for an invalid schema name.
    """
    parts = urlsplit(url.strip())
    options = dict(parse_qsl(parts.query))
    schema = options.pop("schema", "public")
    if not _SCHEMA_NAME.fullmatch(schema):
        raise UsageError(
            f"invalid schema {schema!r} in the store URL: use letters, digits and _ (e.g. loopd)"
        )
    conninfo = urlunsplit(("postgresql", parts.netloc, parts.path, urlencode(options), ""))
    return conninfo, schema


def public_url(url: str) -> str:
    """The URL without a password, for messages."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        user, host = netloc.rsplit("@", 1)
        netloc = f"{user.split(':', 1)[0]}@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))
