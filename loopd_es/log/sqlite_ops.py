"""What the SQLite backend runs on its connection: schema checks, group commits, verification (reads are
in :mod:`.sqlite_reads`).

Every function here takes a plain :class:`sqlite3.Connection` and runs synchronously, either on the event-loop
thread (an uncontended commit) or on the store's one worker thread (:mod:`.sqlite`).
"""

from __future__ import annotations

import sqlite3
import time
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final

import msgspec

from ..clock import now_rfc3339
from ..errors import (
    CorruptLogError,
    LockTimeoutError,
    LogNotFoundError,
    LoopdError,
    NotALogError,
    StoreUnavailableError,
    WrongExpectedVersionError,
)
from ..events.envelope import Envelope
from . import sqlite_coord
from .base import check_expected_version

if TYPE_CHECKING:
    from .group_commit import Request
    from .invariants import VerifyReport

BUSY_TIMEOUT_MS: Final = 60_000
APPLICATION_ID: Final = 0x6C6F6F70  # "loop": marks a database this library created
_IN_CHUNK: Final = 500  # ids per IN (...) query: far below SQLite's bound-variable limit (999 on old builds)
COLUMNS: Final = "position, stream, version, event_id, type, schema_version, recorded_at, causation_id, correlation_id, data"
COLUMN_NAMES: Final = [c.strip() for c in COLUMNS.split(",")]
INSERT: Final = f"INSERT INTO events ({COLUMNS}, crc) VALUES (?,?,?,?,?,?,?,?,?,?,?)"
_SCHEMA: Final = """
CREATE TABLE events (
    position       INTEGER PRIMARY KEY,
    stream         TEXT    NOT NULL,
    version        INTEGER NOT NULL,
    event_id       TEXT    NOT NULL UNIQUE,
    type           TEXT    NOT NULL,
    schema_version INTEGER NOT NULL,
    recorded_at    TEXT    NOT NULL,
    causation_id   TEXT,
    correlation_id TEXT,
    data           BLOB    NOT NULL,
    crc            INTEGER,
    UNIQUE (stream, version)
)
"""
_ADD_CRC: Final = "ALTER TABLE events ADD COLUMN crc INTEGER"


def row_crc(
    position: int,
    stream: str,
    version: int,
    event_id: str,
    kind: str,
    schema_version: int,
    recorded_at: str,
    causation_id: str | None,
    correlation_id: str | None,
    data: bytes | str,
) -> int:
    """CRC-32 of every field of a row (the nine envelope fields as MessagePack, then the payload bytes): what
    ``verify`` recomputes to catch an edit that stays valid JSON."""
    head = _PACK(
        (position, stream, version, event_id, kind, schema_version, recorded_at, causation_id, correlation_id)
    )
    return zlib.crc32(data if isinstance(data, bytes) else str(data).encode(), zlib.crc32(head))


_PACK: Final = msgspec.msgpack.Encoder().encode
_Raw: Final = msgspec.Raw


# -- opening ------------------------------------------------------------------------------------------


def check_log(conn: sqlite3.Connection, where: str) -> bool | None:
    """True when the database holds a loopd-es log with checksums, None for one written before checksums
    (readable; a writer adds them), False when it holds no table at all.

    :raises NotALogError: for any other database, or a file that is not a database.
    """
    try:
        tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        app = conn.execute("PRAGMA application_id").fetchone()[0]
    except sqlite3.DatabaseError as e:
        if "not a database" in str(e) or "malformed" in str(e) or "encrypted" in str(e):
            raise NotALogError(where, "the file is not an SQLite database") from e
        raise
    if not tables:
        if app not in (0, APPLICATION_ID):
            raise NotALogError(where, f"the database belongs to another application (application_id {app})")
        return False
    if "events" not in tables or app not in (0, APPLICATION_ID):
        raise NotALogError(where, f"the database holds other tables ({', '.join(sorted(tables)[:5])})")
    columns = [row[1] for row in conn.execute("PRAGMA table_info(events)")]
    if columns == COLUMN_NAMES:
        return None
    if columns != [*COLUMN_NAMES, "crc"]:
        raise NotALogError(where, f"its 'events' table has other columns ({', '.join(columns)})")
    return True


def setup(conn: sqlite3.Connection, where: str, synchronous: str, create: bool) -> None:
    """Check the database is a loopd-es log; with ``create``, turn an empty database into one (WAL).

    Without ``create`` nothing is written: a reader never alters a database, ours or anyone else's.

    :raises LogNotFoundError: without ``create``, when the database holds no log yet.
    :raises NotALogError: when the database is something else.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    delay = 0.001
    while True:  # SQLite answers busy without waiting while another opener recovers or creates the WAL
        try:
            _setup_once(conn, where, synchronous, create)
            return
        except sqlite3.OperationalError as e:
            if not is_busy(e) or time.monotonic() > deadline:
                raise
            rollback(conn)
            time.sleep(delay)
            delay = min(delay * 2, 0.05)


def _setup_once(conn: sqlite3.Connection, where: str, synchronous: str, create: bool) -> None:
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    state = check_log(conn, where)
    if state is not False:
        if create and str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
            _switch_to_wal(conn)
        if create and state is None:
            _add_checksums(conn, where)
        return
    if not create:
        raise LogNotFoundError(where)
    _switch_to_wal(conn)
    with _write_transaction(conn):
        if check_log(conn, where) is False:  # another process may have created it meanwhile
            conn.execute(_SCHEMA)
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")


def _add_checksums(conn: sqlite3.Connection, where: str) -> None:
    """Give a log written before checksums its ``crc`` column, computed from each row as it stands (once)."""
    conn.create_function("loopd_crc", 10, row_crc, deterministic=True)
    with _write_transaction(conn):
        if check_log(conn, where) is None:  # another writer may have done it meanwhile
            conn.execute(_ADD_CRC)
            conn.execute(f"UPDATE events SET crc = loopd_crc({COLUMNS})")


@contextmanager
def _write_transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``, rolled back on any error (schema set-up and upgrades)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _switch_to_wal(conn: sqlite3.Connection) -> None:
    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    if str(mode).lower() != "wal":
        raise StoreUnavailableError(f"cannot switch the database to WAL mode (it stays in {mode!r})")


def is_busy(error: sqlite3.Error) -> bool:
    text = str(error)
    return "locked" in text or "busy" in text


# -- writing ------------------------------------------------------------------------------------------


def commit_group(conn: sqlite3.Connection, group: list[Request]) -> None:
    """One transaction for every request of the group; a refused request does not affect the others.

    Savepoints isolate requests only when the group has several: a lone request whose ids hit the
    UNIQUE index rolls back the whole (otherwise empty) transaction instead, one statement pair cheaper.
    """
    conn.execute("BEGIN IMMEDIATE")  # outside the try: when it fails there is nothing to roll back
    try:
        group = _fenced_out(conn, group)
        if not group:
            conn.execute("COMMIT")
            return
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    isolate = len(group) > 1
    try:
        versions: dict[str, int] = {}
        if isolate or len(group[0].parts) > 1:
            head = conn.execute("SELECT coalesce(max(position), 0) FROM events").fetchone()[0]
        else:  # the commonest commit, one append to one stream: head and version in one statement
            stream = group[0].stream
            head, versions[stream] = conn.execute(_HEAD_AND_VERSION, (stream,)).fetchone()
        recorded_at = now_rfc3339()
        if isolate and _stage_group(conn, group, head, recorded_at):
            conn.execute("COMMIT")
            return
        for request in group:
            request.error = None
            try:
                head = _stage(conn, request, head, versions, recorded_at, isolate)
            except LoopdError as e:
                request.error = e
        conn.execute("COMMIT")
    except _SeenIds:
        conn.execute("ROLLBACK")
        (request,) = group
        try:
            request.result = retry_of(conn, request) or []
        except LoopdError as e:
            request.error = e
        if not request.result and request.error is None:
            raise CorruptLogError(
                str(conn), None, "an insert hit a unique index but no recorded event matches"
            ) from None
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        for request in group:
            request.result = []
        raise


def _fenced_out(conn: sqlite3.Connection, group: list[Request]) -> list[Request]:
    """The requests of ``group`` whose fences hold; the others get their :class:`FenceLostError` now."""
    if not any(request.fences for request in group):
        return group
    kept = []
    for request in group:
        lost = sqlite_coord.check_fences(conn, request.fences) if request.fences else None
        if lost is None:
            kept.append(request)
        else:
            request.error = lost
    return kept


def _stage_group(conn: sqlite3.Connection, group: list[Request], head: int, recorded_at: str) -> bool:
    """Stage a whole group with a handful of statements when no id in it is already taken.

    Returns False (having written nothing) when an id is already in the log or repeats across the group,
    so that the caller resolves those retries request by request, with savepoints.
    """
    ids = [new.event_id for request in group for part in request.parts for new in part.events]
    if len(set(ids)) != len(ids):
        return False
    for chunk in _chunks(ids):
        marks = ",".join("?" * len(chunk))
        if conn.execute(f"SELECT 1 FROM events WHERE event_id IN ({marks}) LIMIT 1", chunk).fetchone():
            return False
    # one max() per stream: SQLite answers it from the (stream, version) index in O(log n)
    versions = {part.stream: stream_version(conn, part.stream) for request in group for part in request.parts}
    rows: list[tuple[Any, ...]] = []
    staged = []
    for request in group:
        request.error = None
        try:  # no id of the group is recorded, so a version mismatch is no retry
            for part in request.parts:
                check_expected_version(part.stream, part.expected, versions[part.stream])
        except WrongExpectedVersionError as e:
            request.error = e
            continue
        envelopes = place_envelopes(request, head, versions, recorded_at, rows)
        head = envelopes[-1].position
        staged.append((request, envelopes))
    # ids are unused and versions were read under the write lock: the insert cannot hit a unique index
    conn.executemany(INSERT, rows)
    for request, envelopes in staged:
        request.result = envelopes
    return True


def place_envelopes(
    request: Request, head: int, versions: dict[str, int], recorded_at: str, rows: list[tuple[Any, ...]]
) -> list[Envelope]:
    """The envelopes of a request placed after ``head``; advances ``versions`` and adds rows to ``rows``.

    Each row's checksum is :func:`row_crc` of its fields, computed here without the call (payloads are
    bytes): this runs once per event appended.
    """
    envelopes = []
    pack, crc32, raw = _PACK, zlib.crc32, _Raw
    for stream, events, _expected, payloads in request.parts:
        version = versions[stream]
        for new, data in zip(events, payloads, strict=True):
            head += 1
            version += 1
            fields = (
                head,
                stream,
                version,
                new.event_id,
                new.type,
                new.schema_version,
                recorded_at,
                new.causation_id,
                new.correlation_id,
            )
            rows.append((*fields, data, crc32(data, crc32(pack(fields)))))
            envelopes.append(Envelope(*fields, raw(data)))
        versions[stream] = version
    return envelopes


_HEAD_AND_VERSION: Final = (
    "SELECT (SELECT coalesce(max(position), 0) FROM events),"
    " (SELECT coalesce(max(version), 0) FROM events WHERE stream = ?)"
)


class _SeenIds(Exception):
    """A lone request's event ids are already recorded: resolve it as a retry outside the transaction."""


def _stage(
    conn: sqlite3.Connection,
    request: Request,
    head: int,
    versions: dict[str, int],
    recorded_at: str,
    isolate: bool,
) -> int:
    """Insert one request's events; ids are checked by the UNIQUE constraint, retries resolved on a hit."""
    current = {
        part.stream: versions[part.stream] if part.stream in versions else stream_version(conn, part.stream)
        for part in request.parts
    }
    try:
        for part in request.parts:
            check_expected_version(part.stream, part.expected, current[part.stream])
    except WrongExpectedVersionError:
        retried = retry_of(conn, request)  # a retry of an appended batch wins over the version check
        if retried is None:
            raise
        request.result = retried
        return head
    rows: list[tuple[Any, ...]] = []
    staged = dict(current)
    envelopes = place_envelopes(request, head, staged, recorded_at, rows)
    if isolate:
        conn.execute("SAVEPOINT request")
    try:
        conn.executemany(INSERT, rows)
    except sqlite3.IntegrityError:
        if not isolate:
            raise _SeenIds from None
        conn.execute("ROLLBACK TO request")
        conn.execute("RELEASE request")
        retried = retry_of(conn, request)
        if retried is None:
            raise
        request.result = retried
        return head
    if isolate:
        conn.execute("RELEASE request")
    versions.update(staged)
    request.result = envelopes
    return envelopes[-1].position


def retry_of(conn: sqlite3.Connection, request: Request) -> list[Envelope] | None:
    """The originals when every id of the request is recorded with the same content; None when all are new.

    :raises DuplicateEventIdError: for a reused id with other content, or a mix of recorded and new ids.
    """
    found: dict[str, Envelope] = {}
    ids = [new.event_id for part in request.parts for new in part.events]
    for chunk in _chunks(ids):
        marks = ",".join("?" * len(chunk))
        for row in conn.execute(f"SELECT {COLUMNS} FROM events WHERE event_id IN ({marks})", chunk):
            env = row_to_envelope(row)
            found[env.event_id] = env
    if not found:
        return None
    return request.retry_result([found.get(i) for i in ids])


def _chunks(ids: Sequence[str]) -> Iterator[Sequence[str]]:
    for i in range(0, len(ids), _IN_CHUNK):
        yield ids[i : i + _IN_CHUNK]


# -- reading ------------------------------------------------------------------------------------------


def row_to_envelope(row: tuple[Any, ...]) -> Envelope:
    return Envelope(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8], _Raw(row[9]))


def stream_version(conn: sqlite3.Connection, stream: str) -> int:
    return int(
        conn.execute("SELECT coalesce(max(version), 0) FROM events WHERE stream = ?", (stream,)).fetchone()[0]
    )


def rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        conn.execute("ROLLBACK")


# -- verification -------------------------------------------------------------------------------------


def verify(conn: sqlite3.Connection, report: VerifyReport) -> None:
    where = str(report.url)
    check = conn.execute("PRAGMA quick_check").fetchone()[0]
    if check != "ok":
        report.problems.append(f"{where}: SQLite quick_check: {check}")
    count, low, high = conn.execute("SELECT count(*), min(position), max(position) FROM events").fetchone()
    report.events = count
    if count and (low != 1 or high != count):
        report.problems.append(f"{where}: positions are not gapless: {count} events span {low}..{high}")
    rows = conn.execute(
        "SELECT stream, count(*), min(version), max(version) FROM events GROUP BY stream"
    ).fetchall()
    report.streams = len(rows)
    for stream, n, vmin, vmax in rows:
        if vmin != 1 or vmax != n:
            report.problems.append(f"{where}: stream {stream!r}: {n} events span versions {vmin}..{vmax}")
    decoder = msgspec.json.Decoder()
    checked = check_log(conn, where) is True
    if not checked:
        report.notes.append(
            f"{where}: written before per-event checksums: edits that keep valid JSON cannot be detected "
            "until a writer (any append) adds them"
        )
    select = f"SELECT {COLUMNS}, {'crc' if checked else 'NULL'} FROM events ORDER BY position"
    for row in conn.execute(select):
        position, data = row[0], row[9]
        if checked and row[10] != row_crc(*row[:10]):
            report.problems.append(
                f"{where}: event at position {position}: checksum mismatch: the row was changed after it was "
                "written (or its checksum was)"
            )
        try:
            value = decoder.decode(data)
        except msgspec.DecodeError as e:
            report.problems.append(f"{where}: event at position {position}: data does not decode: {e}")
            continue
        if not isinstance(value, dict):
            report.problems.append(f"{where}: event at position {position}: data is not a JSON object")
        if len(report.problems) >= 20:
            report.problems.append("... stopping after 20 problems")
            return


def translate(
    error: sqlite3.Error, where: str, waited: float | None, timeout_ms: int = BUSY_TIMEOUT_MS
) -> LoopdError:
    """The loopd-es error for an SQLite error: a lock timeout, corruption, or an unusable store.

    ``waited`` is how long the failed call took: a busy error long before the busy timeout is SQLite
    declining to wait (e.g. while it recovers a crashed writer's WAL), not a timeout.
    """
    text = str(error)
    if is_busy(error):
        if waited is not None and waited >= timeout_ms / 1000 * 0.9:
            return LockTimeoutError(where, timeout_ms / 1000)
        return StoreUnavailableError(
            f"{where} is busy ({text}) after {waited or 0:.2f} s; another process is opening or recovering it - retry"
        )
    if "not a database" in text:
        return NotALogError(where, "the file is not an SQLite database")
    if "malformed" in text:
        return CorruptLogError(where, None, f"SQLite says: {text}")
    return StoreUnavailableError(
        f"SQLite error on {where}: {text}; check the path, permissions and free space"
    )
