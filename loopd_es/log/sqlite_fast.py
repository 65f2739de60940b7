"""The SQLite backend's fast commit: one lone request placed from a remembered head, with no head look-up.

Positions are gapless and the primary key, so the head and stream versions this connection remembers from its
own last commit are proof enough: if anything else was committed since, it took the very position this commit
places its first event at, and the insert hits the primary key. An insert that lands therefore saw exactly
the remembered state, and its version check was right. So a lone unfenced one-event append is one INSERT in
autocommit (SQLite makes a statement atomic), where the general path runs BEGIN IMMEDIATE, a head SELECT, the
INSERT and COMMIT; a lone batch or fenced request skips the SELECT. Anything this path cannot settle on its
own (a unique-index hit, a version mismatch, a group) goes to :func:`.sqlite_ops.commit_group`, which forgets
what is remembered.
"""

from __future__ import annotations

import functools
import sqlite3
from typing import TYPE_CHECKING, Any, Final

from ..errors import WrongExpectedVersionError
from ..events.envelope import now_rfc3339
from . import sqlite_coord
from .base import check_expected_version
from .sqlite_ops import COLUMN_NAMES, INSERT, commit_group, place_envelopes

if TYPE_CHECKING:
    from .group_commit import Request

_ONE_ROW: Final = "(" + ",".join("?" * (len(COLUMN_NAMES) + 1)) + ")"  # the columns and the checksum
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


def commit(conn: sqlite3.Connection, group: list[Request], heads: Heads) -> None:
    """Commit ``group``: on the fast path when it can, else on the general one (:func:`.sqlite_ops.commit_group`)."""
    if not commit_lone(conn, group, heads):
        commit_group(conn, group)


def commit_lone(conn: sqlite3.Connection, group: list[Request], heads: Heads) -> bool:
    """Commit ``group`` on the fast path when it is one request to one stream; False when it must take the
    general path (nothing was written then, and ``heads`` is forgotten)."""
    if len(group) != 1:
        heads.forget()
        return False
    (request,) = group
    if len(request.parts) != 1:
        heads.forget()
        return False
    stream = request.stream
    if heads.head is None or stream not in heads.versions:
        _learn(conn, heads, stream)
    head = heads.head
    assert head is not None
    version = heads.versions[stream]
    try:
        check_expected_version(stream, request.expected, version)
    except WrongExpectedVersionError:
        heads.forget()  # maybe stale, or a retry of recorded events: the general path tells which
        return False
    rows: list[tuple[Any, ...]] = []
    staged = {stream: version}
    envelopes = place_envelopes(request, head, staged, now_rfc3339(), rows)
    most = _rows_per_statement(conn)
    try:
        if len(rows) <= most and not request.fences:
            _insert(conn, rows)
        else:
            conn.execute("BEGIN IMMEDIATE")
            try:
                if request.fences:
                    lost = sqlite_coord.check_fences(conn, request.fences)
                    if lost is not None:
                        conn.execute("ROLLBACK")
                        request.error = lost
                        return True
                for start in range(0, len(rows), most):
                    _insert(conn, rows[start : start + most])
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
    except sqlite3.IntegrityError:  # a position someone else took, or a recorded event id
        heads.forget()
        return False
    except BaseException:
        heads.forget()
        raise
    heads.head = envelopes[-1].position
    heads.versions[stream] = staged[stream]
    request.error = None
    request.result = envelopes
    return True


def _insert(conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
    """Insert ``rows`` with one statement: a multi-row VALUES binds and steps once, about a fifth cheaper a
    row than ``executemany`` (which also needs a transaction around it to be atomic)."""
    if len(rows) == 1:
        conn.execute(INSERT, rows[0])
    else:
        conn.execute(_insert_many(len(rows)), [value for row in rows for value in row])


@functools.lru_cache(maxsize=64)
def _insert_many(count: int) -> str:
    return INSERT.replace(_ONE_ROW, ",".join([_ONE_ROW] * count))


def _rows_per_statement(conn: sqlite3.Connection) -> int:
    """How many rows one INSERT may carry within this SQLite's bound-variable limit (999 on old builds)."""
    return conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // _ONE_ROW.count("?")


def _learn(conn: sqlite3.Connection, heads: Heads, stream: str) -> None:
    """Read the head and ``stream``'s version (one statement, outside any transaction)."""
    if len(heads.versions) >= _MAX_STREAMS:
        heads.versions.clear()
    head, version = conn.execute(_HEAD_AND_VERSION, (stream,)).fetchone()
    if heads.head is not None and head != heads.head:
        heads.versions.clear()  # the log moved on: every other remembered version may be stale
    heads.head = head
    heads.versions[stream] = version


_HEAD_AND_VERSION: Final = (
    "SELECT (SELECT coalesce(max(position), 0) FROM events),"
    " (SELECT coalesce(max(version), 0) FROM events WHERE stream = ?)"
)
