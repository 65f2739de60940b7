"""The PostgreSQL backend: one log for many machines, with psycopg 3 (async, pooled).

Positions are gap-free **and become visible in commit order**: every append transaction takes one
transaction-level advisory lock before it reads the head, and holds it until it commits or rolls back.
A transaction that rolls back consumed nothing (positions are ``max + 1``, never a sequence), and no
transaction can commit position N+1 while N is still invisible, so a reader that follows the log by
position never skips an event that commits later with a lower position. The price is that appends to
one log are serialised, as on SQLite; group commit makes each transaction carry every append that
arrived meanwhile in this process.

Each commit sends ``NOTIFY loopd_es_events`` with the new head (delivered when the transaction commits),
so followers on any machine wake within milliseconds (:meth:`PostgresLog.wait_for`).

URL: ``postgresql://user@host:port/db?schema=NAME`` (``postgres://`` too); ``schema`` (default
``public``) is the only loopd-es option, the rest is passed to libpq as it is.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from itertools import starmap
from typing import Any, Final, TypeVar

import anyio
import anyio.lowlevel
import msgspec
import psycopg
import psycopg.errors
import psycopg_pool
from psycopg import sql

from ..clock import now_rfc3339
from ..errors import (
    LoopdError,
    StorageError,
    StoreUnavailableError,
    UsageError,
)
from ..events.envelope import Envelope, ExpectedVersion, Recorded, StreamRows
from . import postgres_coord, postgres_rows, postgres_schema
from .base import (
    MAX_POSITION,
    READ_BATCH,
    LogStore,
    check_expected_version,
    stream_rows_batches,
)
from .coord import Claim, check_swap
from .group_commit import GroupCommitter, Part, Request
from .invariants import SequenceChecker, VerifyReport
from .postgres_errors import TranslatedConnection
from .postgres_sql import (
    ANY_VERSION,
    APPEND_FUNCTION_NAME,
    CHANNEL,
    COLUMNS,
    EXISTS_VERSION,
    LOCK,
    LOCK_KEY,
    NO_STREAM_VERSION,
    NOTIFY,
    STATEMENTS,
)
from .postgres_url import public_url, split_postgres_url

CONNECT_TIMEOUT_S: Final = 10
"""libpq's ``connect_timeout`` when the URL gives none: a server that takes the connection and never answers
held every command (and ``run``, deaf to Ctrl-C) for libpq's own 130 s."""

POOL_WAIT_S: Final = 5.0
"""How long a call waits for a connection before it fails with :class:`StoreUnavailableError` (psycopg's pool
waits 30 s by default: a server that went away must be said, and waited out, sooner than a lease runs out)."""
POOL_RECONNECT_S: Final = 10.0
"""How long one of the pool's reconnection attempts keeps retrying before it gives up (psycopg's default: 5 min).
Its retries back off exponentially (1, 2, 4 ... 64 s), so after a two-minute outage the next try could be a minute
away while the server is back. Given up sooner, the next call that wants a connection starts a fresh attempt at
once: the engine's own backoff (at most 5 s) then decides how soon a returning server is seen."""
_Raw: Final = msgspec.Raw
R = TypeVar("R", Envelope, Recorded)
_log = logging.getLogger("loopd_es.log")


class PostgresLog(LogStore):
    """An append-only log in one PostgreSQL table, shared by any number of processes and machines."""

    def __init__(self, url: str, pool: psycopg_pool.AsyncConnectionPool[Any], schema: str) -> None:
        self.url = public_url(url)
        self.schema = schema
        self._pool = pool
        self._conninfo = _conninfo(url)[0]
        self._table = sql.Identifier(schema, "events")
        self._function = sql.Identifier(schema, APPEND_FUNCTION_NAME)
        self._fast: bool | None = None
        """Whether the fast path's function is installed; None until known (a log opened without ``create``)."""
        self._sql = {
            name: statement.format(t=self._table, f=self._function) for name, statement in STATEMENTS.items()
        }
        self._stream_rows = (postgres_rows.ROWS.format(self._table), postgres_rows.PLACE.format(self._table))
        self._coord = postgres_coord.statements(schema)
        self._coord_ready = False
        self._group = GroupCommitter(self._commit)
        self._closed = False

    @classmethod
    async def open(cls, url: str, *, create: bool = True) -> PostgresLog:
        """Connect, and (with ``create``) make sure the schema and table exist.

        :raises StoreUnavailableError: when the server cannot be reached or the table is not a loopd-es log.
        :raises LogNotFoundError: when the log does not exist and ``create`` is false.
        """
        conninfo, schema = _conninfo(url)
        try:  # one plain connection first: it fails at once with libpq's reason, where a pool retries
            probe = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
        except psycopg.Error as e:
            reason = str(e).strip().splitlines()[-1 if "failed:" not in str(e) else 0].strip()
            raise StoreUnavailableError(
                f"cannot connect to {public_url(url)}: {reason}; check that the server runs and the URL"
            ) from e
        await probe.close()
        pool: psycopg_pool.AsyncConnectionPool[Any] = psycopg_pool.AsyncConnectionPool(
            conninfo,
            min_size=1,
            max_size=4,
            open=False,
            kwargs={"autocommit": True},
            configure=_configure,
            timeout=POOL_WAIT_S,
            reconnect_timeout=POOL_RECONNECT_S,
        )
        try:
            await pool.open(wait=True, timeout=10)
        except psycopg_pool.PoolTimeout as e:
            await pool.close()
            raise StoreUnavailableError(
                f"cannot connect to {public_url(url)}: {e}; check that the server runs and the URL"
            ) from e
        store = cls(url, pool, schema)
        try:
            await store._setup(create)
        except BaseException:
            await pool.close()
            raise
        return store

    async def _setup(self, create: bool) -> None:
        async with self._connection() as conn:
            await postgres_schema.ensure_table(conn, self.url, self.schema, self._table, create=create)
            if create:
                await self._install_function(conn)

    async def _install_function(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self._fast = await postgres_schema.install_function(
            conn, self.url, self.schema, self._table, self._function
        )

    def _connection(self) -> Any:
        if self._closed:
            raise StorageError(f"{self.url} is closed; open the store again")
        return TranslatedConnection(self._pool.connection(), self.url)

    # -- writing ------------------------------------------------------------------------------------

    async def _submit(self, request: Request) -> list[Envelope]:
        return await self._group.submit(request)

    async def _commit(self, group: list[Request]) -> None:
        """Commit a group: in one statement when nothing in it is a retry or a conflict, else carefully."""
        parts = [part for request in group for part in request.parts]
        ids = [new.event_id for part in parts for new in part.events]
        fenced = any(request.fences for request in group)
        if fenced and not self._coord_ready:
            async with self._connection() as conn:
                await self._ensure_coord(conn)
        if self._fast is None:
            async with self._connection() as conn:
                await self._install_function(conn)
        if (
            self._fast
            and not fenced
            and len({part.stream for part in parts}) == len(parts)
            and len(set(ids)) == len(ids)
        ):
            if await self._commit_fast(group, parts):
                return
        await self._commit_careful(group, ids)

    async def _commit_fast(self, group: list[Request], parts: list[Part]) -> bool:
        """One statement for the whole group; False (nothing written) when an id is recorded or a version is off.

        The server-side function refuses when a version is off and fails on the UNIQUE index when an id is
        recorded (a retry); the careful path then decides each request's own outcome.
        """
        recorded_at = now_rfc3339()
        events = [new for part in parts for new in part.events]
        payloads = [data for part in parts for data in part.payloads]
        args = (
            [part.stream for part in parts],
            [_expected_code(part.expected) for part in parts],
            [len(part.events) for part in parts],
            [new.event_id for new in events],
            [new.type for new in events],
            [new.schema_version for new in events],
            [new.causation_id for new in events],
            [new.correlation_id for new in events],
            payloads,
            recorded_at,
            f"{self.schema}:",
        )
        async with self._connection() as conn:
            try:
                row = await (await conn.execute(self._sql["fast"], args)).fetchone()
            except psycopg.errors.UniqueViolation:
                return False  # the statement wrote nothing, and its lock went with it
        firsts = row[0] if row else None
        if firsts is None:
            return False
        head = int(firsts[0])
        versions = iter(firsts[1:])
        for request in group:
            envelopes: list[Envelope] = []
            for part in request.parts:
                head = _place(part, head, int(next(versions)), recorded_at, envelopes)
            request.error = None
            request.result = envelopes
        return True

    async def _commit_careful(self, group: list[Request], ids: list[str]) -> None:
        """One transaction for the whole group under the position lock; every check precedes every insert.

        Holding the lock, nothing else can write, so ids, versions and the head read here stay true until
        the insert: each request is resolved (retry, conflict, or new) against what is recorded plus what the
        group staged before it, all its parts or none, and then all staged rows go in with one statement.
        Pipelined, that is two round trips: BEGIN + lock + the three reads, then INSERT + NOTIFY + COMMIT.
        (The reads must be statements of their own after the lock's: a statement's snapshot is taken when it
        starts.)
        """
        streams = sorted({part.stream for request in group for part in request.parts})
        staged: list[tuple[Request, list[Envelope]]] = []
        async with self._connection() as conn, conn.pipeline(), conn.transaction():
            await conn.execute(LOCK, (LOCK_KEY,))
            by_id = await conn.execute(self._sql["by_id"], (ids,), binary=True)
            by_stream = await conn.execute(self._sql["versions"], (streams,))
            at_head = await conn.execute(self._sql["head"])
            recorded = {env.event_id: env for env in starmap(_row_to_envelope, await by_id.fetchall())}
            versions: dict[str, int] = {row[0]: int(row[1]) for row in await by_stream.fetchall()}
            head = int((await at_head.fetchone() or (0,))[0])
            recorded_at = now_rfc3339()
            rows: list[Envelope] = []
            for request in group:
                request.error = None
                if request.fences:
                    lost = await postgres_coord.check_fences(conn, self._coord["fences"], request.fences)
                    if lost is not None:
                        request.error = lost
                        continue
                try:
                    retried = request.retry_result([recorded.get(new.event_id) for new in request.all_events])
                    if retried is not None:
                        request.result = retried
                        continue
                    for part in request.parts:
                        check_expected_version(part.stream, part.expected, versions.get(part.stream, 0))
                except LoopdError as e:
                    request.error = e
                    continue
                envelopes: list[Envelope] = []
                for part in request.parts:
                    head = _place(part, head, versions.get(part.stream, 0), recorded_at, envelopes)
                    versions[part.stream] = envelopes[-1].version
                for env in envelopes:
                    recorded[env.event_id] = env  # a later request of the group retrying it sees it
                rows.extend(envelopes)
                staged.append((request, envelopes))
            if rows:
                columns = [
                    list(column) for column in zip(*(_row(env, bytes(env.data)) for env in rows), strict=True)
                ]
                await conn.execute(self._sql["insert"], columns)
                await conn.execute(NOTIFY, (CHANNEL, f"{self.schema}:{head}"))
        for request, envelopes in staged:
            request.result = envelopes

    # -- coordination -------------------------------------------------------------------------------

    async def _ensure_coord(self, conn: Any) -> None:
        if not self._coord_ready:
            await postgres_coord.ensure_table(conn, self.schema)
            self._coord_ready = True

    async def coord_read(self, prefix: str = "") -> list[Claim]:
        async with self._connection() as conn:
            bound = postgres_coord.upper_bound(prefix)
            try:
                rows = await (await conn.execute(self._coord["read"], (prefix, bound, bound))).fetchall()
            except psycopg.errors.UndefinedTable:
                return []  # nothing ever coordinated on this log (and a reader creates nothing)
        return [postgres_coord.claim_of(row) for row in rows]

    async def coord_swap(self, key: str, expected_token: int, new: Claim | None) -> Claim | None:
        check_swap(key, expected_token, new)
        async with self._connection() as conn:
            await self._ensure_coord(conn)
            return await postgres_coord.swap(conn, self._coord, key, expected_token, new)

    # -- reading ------------------------------------------------------------------------------------

    async def read_batches(
        self,
        *,
        from_position: int = 1,
        limit: int | None = None,
        stream: str | None = None,
        from_version: int = 1,
    ) -> AsyncIterator[list[Envelope]]:
        async for batch in self._select(
            COLUMNS, _row_to_envelope, from_position, limit, stream, from_version
        ):
            yield batch

    async def read_recorded(
        self,
        *,
        from_position: int = 1,
        limit: int | None = None,
        stream: str | None = None,
        from_version: int = 1,
    ) -> AsyncIterator[list[Recorded]]:
        async for batch in self._select(
            RECORDED_COLUMNS, Recorded, from_position, limit, stream, from_version
        ):
            yield batch

    def read_stream_rows(
        self, stream: str, *, from_version: int = 1, until_position: int | None = None
    ) -> AsyncIterator[StreamRows]:
        until = MAX_POSITION if until_position is None else until_position
        statements = self._stream_rows

        async def read(after: int) -> StreamRows | None:
            await anyio.lowlevel.checkpoint()
            async with self._connection() as conn:
                return await postgres_rows.read_stream_rows(
                    conn, statements, self.url, stream, after, READ_BATCH, until
                )

        return stream_rows_batches(read, from_version)

    async def _select(
        self,
        columns: str,
        convert: Callable[..., R],
        from_position: int,
        limit: int | None,
        stream: str | None,
        from_version: int,
    ) -> AsyncIterator[list[R]]:
        """Bounded batches of ``columns``, each row's values passed to ``convert`` (``Recorded`` itself: its
        columns are in the order of its fields, and bytea arrives as bytes, so no call per row is needed)."""
        remaining = limit if limit is not None else -1
        after = max(from_position, 1) - 1 if stream is None else max(from_version, 1) - 1
        if stream is None:
            query = sql.SQL("SELECT " + columns + " FROM {} WHERE position > %s ORDER BY position LIMIT %s")
        else:
            query = sql.SQL(
                "SELECT " + columns + " FROM {} WHERE stream = %s AND version > %s ORDER BY version LIMIT %s"
            )
        statement = query.format(self._table)
        while remaining != 0:
            size = READ_BATCH if remaining < 0 else min(READ_BATCH, remaining)
            args: tuple[Any, ...] = (after, size) if stream is None else (stream, after, size)
            async with self._connection() as conn:
                rows = await (await conn.execute(statement, args, binary=True)).fetchall()
            batch = list(starmap(convert, rows))
            if not batch:
                return
            yield batch
            if len(batch) < size:
                return
            after = batch[-1].position if stream is None else batch[-1].version
            if remaining > 0:
                remaining -= len(batch)
            await anyio.lowlevel.checkpoint()

    async def head(self) -> int:
        return await self._scalar(sql.SQL("SELECT coalesce(max(position), 0) FROM {}").format(self._table))

    async def stream_version(self, stream: str) -> int:
        return await self._scalar(
            sql.SQL("SELECT coalesce(max(version), 0) FROM {} WHERE stream = %s").format(self._table),
            (stream,),
        )

    async def streams(self) -> list[str]:
        async with self._connection() as conn:
            rows = await (
                await conn.execute(
                    sql.SQL("SELECT DISTINCT stream FROM {} ORDER BY stream").format(self._table)
                )
            ).fetchall()
        return [row[0] for row in rows]

    async def _scalar(self, statement: sql.Composed, args: tuple[Any, ...] = ()) -> int:
        async with self._connection() as conn:
            row = await (await conn.execute(statement, args)).fetchone()
        return int(row[0]) if row else 0

    async def commits(self) -> AsyncGenerator[int, None]:
        """Yield the new head after every commit to this log by any process on any machine (LISTEN/NOTIFY).

        Listening starts before the first value is awaited. A lost connection is reopened after a second
        (a warning says so); commits made meanwhile are not replayed, so a follower re-reads the head.
        """
        prefix = f"{self.schema}:"
        while not self._closed:
            try:
                async with await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True) as listener:
                    await listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
                    yield 0  # listening: whatever committed before this point is the caller's to read
                    async for note in listener.notifies():
                        if note.payload.startswith(prefix):
                            yield int(note.payload[len(prefix) :])
            except psycopg.Error as e:
                _log.warning("listening on %s failed (%s); retrying in 1 s", self.url, e)
                await anyio.sleep(1.0)

    async def wait_for(self, position: int, timeout: float | None = None) -> bool:  # noqa: ASYNC109 - the API
        """Wait until the log's head reaches ``position``: woken by NOTIFY from any machine, with a one-second
        poll as a safety net. Returns whether it did before ``timeout`` seconds passed.
        """
        if await self.head() >= position:
            return True
        with anyio.move_on_after(math.inf if timeout is None else timeout):
            commits = self.commits()
            try:
                await anext(commits)  # listening now: no commit after the head read below can be missed
                while await self.head() < position:
                    with anyio.move_on_after(1.0):
                        await anext(commits)
                return True
            finally:
                await commits.aclose()
        return False

    async def verify(self, *, repair: bool = False) -> VerifyReport:
        report = VerifyReport(self.url)
        t = self._table
        async with self._connection() as conn:
            row = await (
                await conn.execute(sql.SQL("SELECT count(*), min(position), max(position) FROM {}").format(t))
            ).fetchone()
            count, low, high = row if row else (0, None, None)
            report.events = int(count)
            if count and (low != 1 or high != count):
                report.problems.append(
                    f"{self.url}: positions are not gapless: {count} events span {low}..{high}"
                )
            rows = await (
                await conn.execute(
                    sql.SQL(
                        "SELECT stream, count(*), min(version), max(version) FROM {} GROUP BY stream"
                    ).format(t)
                )
            ).fetchall()
            report.streams = len(rows)
            for stream, n, vmin, vmax in rows:
                if vmin != 1 or vmax != n:
                    report.problems.append(
                        f"{self.url}: stream {stream!r}: {n} events span versions {vmin}..{vmax}"
                    )
            decoder = msgspec.json.Decoder()
            async with conn.transaction(), conn.cursor(name="verify") as cursor:  # streamed, bounded memory
                await cursor.execute(sql.SQL("SELECT position, data FROM {} ORDER BY position").format(t))
                async for position, data in cursor:
                    try:
                        value = decoder.decode(data)
                    except msgspec.DecodeError as e:
                        report.problems.append(
                            f"{self.url}: event at position {position}: data does not decode: {e}"
                        )
                        continue
                    if not isinstance(value, dict):
                        report.problems.append(
                            f"{self.url}: event at position {position}: data is not a JSON object"
                        )
                    if len(report.problems) >= 20:
                        report.problems.append("... stopping after 20 problems")
                        break
        if repair and not report.ok:
            report.repaired.append("PostgreSQL logs are repaired by PostgreSQL itself; nothing to truncate")
        return report

    async def import_envelopes(self, batches: AsyncIterator[list[Envelope]]) -> int:
        checker = SequenceChecker(self.url)
        async with self._connection() as conn, conn.transaction():
            await conn.execute(LOCK, (LOCK_KEY,))
            row = await (
                await conn.execute(sql.SQL("SELECT count(*) FROM {}").format(self._table))
            ).fetchone()
            if row and row[0]:
                raise UsageError(f"{self.url} is not empty ({row[0]} events); import only into a new log")
            async with conn.cursor() as cursor:
                async for batch in batches:
                    for env in batch:
                        checker.check(env)
                    await cursor.executemany(
                        sql.SQL(
                            "INSERT INTO {} (" + COLUMNS + ") VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)"
                        ).format(self._table),
                        [_row(env, bytes(env.data)) for env in batch],
                    )
            if checker.position:
                await conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"{self.schema}:{checker.position}"))
        return checker.position

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self._pool.close()


def _place(part: Part, head: int, version: int, recorded_at: str, out: list[Envelope]) -> int:
    """Append ``part``'s envelopes after ``head`` and its stream's ``version`` to ``out``; returns the new head."""
    for new, data in zip(part.events, part.payloads, strict=True):
        head += 1
        version += 1
        out.append(
            Envelope(
                head,
                part.stream,
                version,
                new.event_id,
                new.type,
                new.schema_version,
                recorded_at,
                new.causation_id,
                new.correlation_id,
                _Raw(data),
            )
        )
    return head


def _conninfo(url: str) -> tuple[str, str]:
    """The libpq URL and schema of a store URL, with :data:`CONNECT_TIMEOUT_S` unless the URL sets its own."""
    conninfo, schema = split_postgres_url(url)
    if "connect_timeout=" not in conninfo:
        conninfo += ("&" if "?" in conninfo else "?") + f"connect_timeout={CONNECT_TIMEOUT_S}"
    return conninfo, schema


async def _configure(conn: psycopg.AsyncConnection[Any]) -> None:
    """Plan every statement for its own parameters: a generic plan made while the log was small (a sequential
    scan) would otherwise stay in use as it grows, and appends would slow down with the log's size."""
    await conn.execute("SET plan_cache_mode = force_custom_plan")


def _expected_code(expected: ExpectedVersion) -> int:
    """An expected version as the server-side function takes it: N, or a negative code for the keywords."""
    if isinstance(expected, int):
        return expected
    return {"any": ANY_VERSION, "no_stream": NO_STREAM_VERSION, "exists": EXISTS_VERSION}[expected]


def _row(env: Envelope, data: bytes) -> tuple[Any, ...]:
    return (
        env.position,
        env.stream,
        env.version,
        env.event_id,
        env.type,
        env.schema_version,
        env.recorded_at,
        env.causation_id,
        env.correlation_id,
        data,
    )


def _row_to_envelope(*row: Any) -> Envelope:
    """A row of :data:`COLUMNS` as an envelope (its values as arguments: the reads ``starmap`` it)."""
    return Envelope(
        row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8], _Raw(bytes(row[9]))
    )


RECORDED_COLUMNS: Final = "position, stream, version, type, schema_version, recorded_at, data"
