"""The SQLite backend's fast commit: one lone request placed from a remembered head, with no head look-up.

Positions are gapless and the primary key, so the head and stream versions this connection remembers from its
own last commit are proof enough: if anything else was committed since, it took the very position this commit
places its first event at, and the insert hits the primary key. An insert that lands therefore saw exactly
the remembered state, and its version checks were right. So a lone request (one or several streams, fenced or
not) is one INSERT in autocommit (SQLite makes a statement atomic), its fences in the INSERT's WHERE clause,
where the general path runs BEGIN IMMEDIATE, a fence SELECT, a head SELECT, the INSERT and COMMIT. Anything
this path cannot settle on its own (a unique-index hit, a version mismatch, a lost fence, a group of requests)
goes to :func:`.sqlite_ops.commit_group`, which forgets what is remembered and says what went wrong.
"""

from __future__ import annotations

import functools
import sqlite3
from itertools import chain
from typing import TYPE_CHECKING, Any, Final

from ..clock import now_rfc3339
from ..errors import WrongExpectedVersionError
from . import sqlite_coord
from .base import check_expected_version
from .sqlite_ops import COLUMN_NAMES, INSERT, commit_group, place_envelopes

if TYPE_CHECKING:
    from .coord import Fence
    from .group_commit import Request

_ROW_VARIABLES: Final = len(COLUMN_NAMES) + 1  # the columns and the checksum
_ONE_ROW: Final = "(" + ",".join("?" * _ROW_VARIABLES) + ")"
_VARIABLE_LIMIT: Final = sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER
_LEARN_AT_ONCE: Final = 256  # streams of one request the fast path takes (old builds bind <= 999)
_MAX_STREAMS: Final = (
    4096  # remembered stream versions; past it they are forgotten (a look-up brings one back)
)


class Heads:
    """What one connection knows of the log from its own commits: the head and some streams' versions.

    ``head`` is None when unknown; every stream in ``versions`` is exact whenever ``head`` is.
    """

    __slots__ = ("head", "versions")

    def __init__(self) -> None:
        self.head: int | None = None
        self.versions: dict[str, int] = {}

    def forget(self) -> None:
        self.head = None
        self.versions.clear()


def commit(conn: sqlite3.Connection, group: list[Request], heads: Heads) -> bool:
    """Commit ``group``: on the fast path when it can, else on the general one (:func:`.sqlite_ops.commit_group`).

    Returns True (never None: the caller tells a commit from a busy refusal by that).
    """
    if not commit_lone(conn, group, heads):
        commit_group(conn, group)
    return True


def commit_lone(conn: sqlite3.Connection, group: list[Request], heads: Heads) -> bool:
    """Commit ``group`` on the fast path when it is one request; False when it must take the general path
    (nothing was written then, and ``heads`` is forgotten)."""
    if len(group) != 1:
        heads.forget()
        return False
    (request,) = group
    parts = request.parts
    if len(parts) > _LEARN_AT_ONCE:  # one look-up binds a variable per stream
        heads.forget()
        return False
    versions = heads.versions
    known = heads.head is not None
    for part in parts:  # a loop, not any(): this runs once per append
        known = known and part.stream in versions
    if not known:
        _learn(conn, heads, [part.stream for part in parts])
    head = heads.head
    assert head is not None
    staged: dict[str, int] = {}
    try:
        for part in parts:
            staged[part.stream] = version = versions[part.stream]
            check_expected_version(part.stream, part.expected, version)
    except WrongExpectedVersionError:
        heads.forget()  # maybe stale, or a retry of recorded events: the general path tells which
        return False
    rows: list[tuple[Any, ...]] = []
    envelopes = place_envelopes(request, head, staged, now_rfc3339(), rows)
    fences = request.fences
    try:
        if len(rows) * _ROW_VARIABLES + 2 * len(fences) <= conn.getlimit(_VARIABLE_LIMIT):
            landed = _insert(conn, rows, fences)
        else:
            landed = _insert_chunks(conn, rows, fences)
    except sqlite3.IntegrityError:  # a position someone else took, or a recorded event id
        landed = False
    except sqlite3.OperationalError as e:
        heads.forget()
        if "no such table" in str(e):  # fenced on a log nothing has coordinated on yet
            return False
        raise
    except BaseException:
        heads.forget()
        raise
    if not landed:  # or a fence that no longer holds: the general path says which
        heads.forget()
        return False
    heads.head = envelopes[-1].position
    versions.update(staged)
    request.error = None
    request.result = envelopes
    return True


def _insert(conn: sqlite3.Connection, rows: list[tuple[Any, ...]], fences: tuple[Fence, ...]) -> bool:
    """Insert ``rows`` with one statement, if every fence holds; returns whether they landed.

    A multi-row VALUES binds and steps once, about a fifth cheaper a row than ``executemany``, and one
    statement is atomic without a transaction around it. The fences are the statement's WHERE clause.
    """
    if not fences:
        if len(rows) == 1:
            conn.execute(INSERT, rows[0])
        else:
            conn.execute(_insert_many(len(rows)), list(chain.from_iterable(rows)))
        return True
    args = list(chain.from_iterable(rows))
    for fence in fences:
        args.extend(fence)
    return conn.execute(_insert_fenced(len(rows), len(fences)), args).rowcount == len(rows)


def _insert_chunks(conn: sqlite3.Connection, rows: list[tuple[Any, ...]], fences: tuple[Fence, ...]) -> bool:
    """Insert more rows than one statement can bind, in one transaction, if every fence holds."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        if fences and sqlite_coord.check_fences(conn, fences) is not None:
            conn.execute("ROLLBACK")
            return False
        most = max(1, _rows_per_statement(conn, ()))  # never an empty range: a bad limit fails loudly
        for start in range(0, len(rows), most):
            _insert(conn, rows[start : start + most], ())
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return True


@functools.lru_cache(maxsize=64)
def _insert_many(count: int) -> str:
    return INSERT.replace(_ONE_ROW, ",".join([_ONE_ROW] * count))


@functools.lru_cache(maxsize=64)
def _insert_fenced(count: int, fences: int) -> str:
    head = INSERT[: INSERT.index(" VALUES ")]
    held = " AND ".join(["EXISTS (SELECT 1 FROM coord WHERE key = ? AND token = ?)"] * fences)
    return f"{head} SELECT * FROM (VALUES {','.join([_ONE_ROW] * count)}) WHERE {held}"


def _rows_per_statement(conn: sqlite3.Connection, fences: tuple[Fence, ...]) -> int:
    """How many rows one INSERT may carry within this SQLite's bound-variable limit (999 on old builds)."""
    return (conn.getlimit(_VARIABLE_LIMIT) - 2 * len(fences)) // _ROW_VARIABLES


def _learn(conn: sqlite3.Connection, heads: Heads, streams: list[str]) -> None:
    """Read the head and the versions of ``streams`` (one statement, outside any transaction)."""
    if len(heads.versions) + len(streams) > _MAX_STREAMS:
        heads.versions.clear()
    head, *versions = conn.execute(_head_and_versions(len(streams)), streams).fetchone()
    if heads.head is not None and head != heads.head:
        heads.versions.clear()  # the log moved on: every other remembered version may be stale
    heads.head = head
    heads.versions.update(zip(streams, versions, strict=True))


@functools.lru_cache(maxsize=16)
def _head_and_versions(count: int) -> str:
    one = "(SELECT coalesce(max(version), 0) FROM events WHERE stream = ?)"
    return f"SELECT (SELECT coalesce(max(position), 0) FROM events), {', '.join([one] * count)}"
