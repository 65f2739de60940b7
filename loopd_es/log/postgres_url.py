"""A PostgreSQL store URL: its libpq part and its schema, and the form of it that messages show.

Apart from :mod:`.postgres` so that what only needs the schema of a URL (a read database's or a command log's
path) does not load psycopg.
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import unquote_plus, urlsplit

from ..errors import UsageError

_SCHEMA_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_SECRET_KEYS: Final = frozenset({"password", "sslpassword"})


def split_postgres_url(url: str) -> tuple[str, str]:
    """Split a store URL into (libpq conninfo URL, schema name).

    The rest of the URL goes to libpq as written: its query is not decoded and re-encoded (a space written
    ``%20`` would become ``+``, which libpq does not read), and an empty host (``postgresql:///db?host=...``)
    keeps its ``//``.

    :raises UsageError: for a URL that cannot be read, or a missing, repeated, invalid or reserved schema.
    """
    try:
        parts = urlsplit(url.strip())
    except ValueError as e:  # a malformed IPv6 host, say
        raise UsageError(f"invalid store URL: {e}") from None
    kept: list[str] = []
    schemas: list[str] = []
    for pair in parts.query.split("&") if parts.query else []:
        key, _, value = pair.partition("=")
        if unquote_plus(key) == "schema":
            schemas.append(unquote_plus(value))
        else:
            kept.append(pair)
    if len(schemas) > 1:
        raise UsageError(
            f"the store URL names a schema {len(schemas)} times ({', '.join(schemas)}): give one"
        )
    schema = schemas[0] if schemas else "public"
    if not _SCHEMA_NAME.fullmatch(schema):
        raise UsageError(
            f"invalid schema {schema!r} in the store URL: use letters, digits and _ (e.g. loopd)"
        )
    if schema.lower().startswith("pg_"):
        raise UsageError(f"schema {schema!r} is reserved by PostgreSQL (pg_...): name another, e.g. loopd")
    query = "&".join(kept)
    conninfo = f"postgresql://{parts.netloc}{parts.path}" + (f"?{query}" if query else "")
    return conninfo, schema


def public_url(url: str) -> str:
    """The URL without a password (``user:password@`` or ``password=`` in the query), for messages."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url.split("@", 1)[-1] if "@" in url else url
    netloc = parts.netloc
    if "@" in netloc:
        user, host = netloc.rsplit("@", 1)
        netloc = f"{user.split(':', 1)[0]}@{host}"
    query = "&".join(
        pair for pair in parts.query.split("&") if unquote_plus(pair.partition("=")[0]).lower() not in _SECRET_KEYS
    ) if parts.query else ""  # fmt: skip
    return f"{parts.scheme}://{netloc}{parts.path}" + (f"?{query}" if query else "")
