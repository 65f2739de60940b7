"""The PostgreSQL backend's coordination table (:mod:`.coord`): ``<schema>.coord`` beside ``<schema>.events``.

A fenced append reads its fence rows ``FOR SHARE`` inside its own transaction, so a compare-and-set that would
move one of those tokens (an ``UPDATE`` of the same row) waits until the append has committed or rolled back:
the fence check and a takeover never interleave. A compare-and-set is one statement (or two, for a record
that does not exist yet), so two contenders for one key are ordered by the row lock or the primary key.
"""

from __future__ import annotations

from typing import Any, Final

from psycopg import sql

from .coord import Claim, Fence, FenceLostError, failed_fence, fence_keys
from .postgres_sql import LOCK, LOCK_KEY

TABLE: Final = sql.SQL(
    "CREATE TABLE IF NOT EXISTS {c} (key text PRIMARY KEY, holder text NOT NULL, token bigint NOT NULL,"
    " expires_us bigint NOT NULL, info text NOT NULL)"
)


async def ensure_table(conn: Any, schema: str) -> None:
    """Create ``<schema>.coord`` unless it exists. ``CREATE TABLE IF NOT EXISTS`` is not safe against itself: two
    sessions creating it at once can both pass the check and one fails on PostgreSQL's catalog index
    (``pg_type_typname_nsp_index``), so creation is serialized by the log's advisory lock, as the events table's
    is."""
    found = await (await conn.execute("SELECT to_regclass(%s)", (f'"{schema}".coord',))).fetchone()
    if found is None or found[0] is None:
        async with conn.transaction():
            await conn.execute(LOCK, (LOCK_KEY,))
            await conn.execute(TABLE.format(c=sql.Identifier(schema, "coord")))


_COLUMNS: Final = "key, holder, token, expires_us, info"
STATEMENTS: Final = {
    "read": sql.SQL(
        "SELECT " + _COLUMNS + " FROM {c} WHERE key >= %s AND (%s = '' OR key < %s) ORDER BY key"
    ),
    "fences": sql.SQL("SELECT " + _COLUMNS + " FROM {c} WHERE key = ANY(%s::text[]) FOR SHARE"),
    "update": sql.SQL(
        "UPDATE {c} SET holder = %s, token = %s, expires_us = %s, info = %s WHERE key = %s AND token = %s"
    ),
    "insert": sql.SQL(
        "INSERT INTO {c} (" + _COLUMNS + ") VALUES (%s, %s, %s, %s, %s) ON CONFLICT (key) DO NOTHING"
    ),
    "delete": sql.SQL("DELETE FROM {c} WHERE key = %s AND token = %s"),
    "one": sql.SQL("SELECT " + _COLUMNS + " FROM {c} WHERE key = %s"),
}


def statements(schema: str) -> dict[str, sql.Composed]:
    """Every statement bound to the schema's table."""
    table = sql.Identifier(schema, "coord")
    return {name: statement.format(c=table) for name, statement in STATEMENTS.items()}


def claim_of(row: tuple[Any, ...]) -> Claim:
    key, holder, token, expires_us, info = row
    return Claim(key=key, holder=holder, token=int(token), expires_us=int(expires_us), info=info)


def upper_bound(prefix: str) -> str:
    """The smallest key after every key that starts with ``prefix`` ('' for no bound)."""
    return prefix + "\U0010ffff" if prefix else ""


async def check_fences(
    conn: Any, statement: sql.Composed, fences: tuple[Fence, ...]
) -> FenceLostError | None:
    """Inside the append's transaction: lock the fence rows (shared) and say which fence no longer holds."""
    rows = await (await conn.execute(statement, (fence_keys(fences),))).fetchall()
    return failed_fence(fences, {claim.key: claim for claim in map(claim_of, rows)})


async def swap(
    conn: Any, ops: dict[str, sql.Composed], key: str, expected_token: int, new: Claim | None
) -> Claim | None:
    """Compare-and-set on an autocommit connection: None when done, else the record found (token 0: none)."""
    if new is None:
        done = (await conn.execute(ops["delete"], (key, expected_token))).rowcount == 1
        if expected_token == 0:
            done = not await (await conn.execute(ops["one"], (key,))).fetchone()
    elif expected_token == 0:
        done = (
            await conn.execute(ops["insert"], (key, new.holder, new.token, new.expires_us, new.info))
        ).rowcount == 1
    else:
        done = (
            await conn.execute(
                ops["update"], (new.holder, new.token, new.expires_us, new.info, key, expected_token)
            )
        ).rowcount == 1
    if done:
        return None
    row = await (await conn.execute(ops["one"], (key,))).fetchone()
    return claim_of(row) if row else Claim(key=key, holder="", token=0, expires_us=0)
