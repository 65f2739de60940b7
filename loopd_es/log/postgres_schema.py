"""The PostgreSQL log's table and its fast path's server-side function: made (or checked) when a store opens."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import psycopg.errors
from psycopg import sql

from ..errors import LogNotFoundError, StoreUnavailableError
from .postgres_sql import (
    APPEND_FUNCTION,
    APPEND_FUNCTION_NAME,
    CHANNEL,
    COLUMNS,
    EXISTS_VERSION,
    LOCK,
    LOCK_KEY,
    NO_STREAM_VERSION,
    TABLE,
)

_log = logging.getLogger("loopd_es.log")


async def ensure_table(
    conn: psycopg.AsyncConnection[Any], url: str, schema: str, table: sql.Identifier, *, create: bool
) -> None:
    """Check that ``schema.events`` is a loopd-es log, or (with ``create``) make it.

    :raises LogNotFoundError: when it does not exist and ``create`` is false.
    :raises StoreUnavailableError: when the table is not a loopd-es log.
    """
    # the catalog, not information_schema, which hides a table from a role without privileges on it: such a
    # role was told "no log" (and to append first) where it lacks permission (exit 4 on the first read)
    found = await (
        await conn.execute(
            "SELECT array_agg(a.attname::text ORDER BY a.attnum) FROM pg_catalog.pg_attribute a"
            " JOIN pg_catalog.pg_class c ON c.oid = a.attrelid"
            " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relname = 'events' AND c.relkind IN ('r', 'p')"
            " AND a.attnum > 0 AND NOT a.attisdropped",
            (schema,),
        )
    ).fetchone()
    columns = found[0] if found else None
    if columns is None:
        if not create:
            raise LogNotFoundError(url)
        async with conn.transaction():
            await conn.execute(LOCK, (LOCK_KEY,))
            await conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
            await conn.execute(TABLE.format(t=table))
    elif list(columns) != [c.strip() for c in COLUMNS.split(",")]:
        raise StoreUnavailableError(
            f"{url}: the table {schema}.events is not a loopd-es log (columns {list(columns)})"
        )


async def install_function(
    conn: psycopg.AsyncConnection[Any], url: str, schema: str, table: sql.Identifier, function: sql.Identifier
) -> bool:
    """Make sure the fast path's function exists (a log written by an older loopd-es has an older one);
    whether it does now. A role that may not create it appends on the careful path only: slower, the same
    outcome."""
    found = await (
        # quoted as the function is created and called: unquoted, "Team" folds to team (another schema's)
        await conn.execute("SELECT to_regproc(%s)", (f'"{schema}".{APPEND_FUNCTION_NAME}',))
    ).fetchone()
    if found is not None and found[0] is not None:
        return True
    try:
        async with conn.transaction():
            await conn.execute(LOCK, (LOCK_KEY,))
            await conn.execute(
                APPEND_FUNCTION.format(
                    f=function,
                    t=table,
                    lock=sql.Literal(LOCK_KEY),
                    channel=sql.Literal(CHANNEL),
                    columns=sql.SQL(COLUMNS),
                    no_stream=sql.Literal(NO_STREAM_VERSION),
                    exists=sql.Literal(EXISTS_VERSION),
                )
            )
    except psycopg.errors.InsufficientPrivilege:
        _log.info("%s: no privilege to create %s; appending without it", url, APPEND_FUNCTION_NAME)
        return False
    return True
