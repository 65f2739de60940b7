"""The SQLite backend's coordination table (:mod:`.coord`): records beside the ``events`` table, same file.

A compare-and-set runs in its own ``BEGIN IMMEDIATE`` transaction, and a fenced append reads its fences inside
the append's, so the two are ordered by SQLite's one write lock. The table is created on first use, which
keeps logs written before it readable and unchanged until something coordinates on them.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Final

from .coord import Claim, failed_fence, fence_keys

if TYPE_CHECKING:
    from .coord import Fence, FenceLostError

_TABLE: Final = (
    "CREATE TABLE IF NOT EXISTS coord ("
    " key TEXT PRIMARY KEY, holder TEXT NOT NULL, token INTEGER NOT NULL,"
    " expires_us INTEGER NOT NULL, info TEXT NOT NULL) WITHOUT ROWID"
)
_COLUMNS: Final = "key, holder, token, expires_us, info"


def _rows(conn: sqlite3.Connection, where: str, args: tuple[str, ...]) -> list[Claim]:
    try:
        rows = conn.execute(f"SELECT {_COLUMNS} FROM coord WHERE {where} ORDER BY key", args).fetchall()
    except sqlite3.OperationalError as e:
        if "no such table" in str(e):
            return []  # nothing ever coordinated on this log
        raise
    return [Claim(key=k, holder=h, token=t, expires_us=x, info=i) for k, h, t, x, i in rows]


def read(conn: sqlite3.Connection, prefix: str) -> list[Claim]:
    """The records whose key starts with ``prefix`` (a range scan on the primary key)."""
    if not prefix:
        return _rows(conn, "1", ())
    return _rows(conn, "key >= ? AND key < ?", (prefix, prefix + "\U0010ffff"))


def check_fences(conn: sqlite3.Connection, fences: tuple[Fence, ...]) -> FenceLostError | None:
    """Inside a write transaction: the error for the first fence that no longer holds, else None."""
    keys = fence_keys(fences)
    found = _rows(conn, f"key IN ({','.join('?' * len(keys))})", tuple(keys))
    return failed_fence(fences, {c.key: c for c in found})


def swap(conn: sqlite3.Connection, key: str, expected_token: int, new: Claim | None) -> Claim | None:
    """Compare-and-set in one write transaction: None when done, else the record found (token 0: none)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(_TABLE)
        (current,) = _rows(conn, "key = ?", (key,)) or [Claim(key=key, holder="", token=0, expires_us=0)]
        if current.token != expected_token:
            conn.execute("ROLLBACK")
            return current
        if new is None:
            conn.execute("DELETE FROM coord WHERE key = ?", (key,))
        else:
            conn.execute(
                f"INSERT OR REPLACE INTO coord ({_COLUMNS}) VALUES (?,?,?,?,?)",
                (new.key, new.holder, new.token, new.expires_us, new.info),
            )
        conn.execute("COMMIT")
        return None
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
