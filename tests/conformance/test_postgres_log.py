"""The log contract on the PostgreSQL backend, plus what only a shared database server has to get right."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel
import pytest

from loopd_es.events.envelope import NewEvent
from loopd_es.log import open_store
from loopd_es.log.postgres import PostgresLog
from loopd_es.log.postgres_sql import CHANNEL
from loopd_es.testing import LogStoreContract
from tests.waits import await_until

from ..postgres_server import pg_url, server_url

if TYPE_CHECKING:
    from loopd_es.log.base import LogStore

pytestmark = pytest.mark.anyio

__all__ = ["pg_url"]


class TestPostgresLog(LogStoreContract):
    @pytest.fixture
    def store_url(self, pg_url: str) -> str:
        return pg_url

    @pytest.fixture
    async def store(self, store_url: str) -> AsyncIterator[LogStore]:
        async with await open_store(store_url) as s:
            yield s

    # -- PostgreSQL only ---------------------------------------------------------------------------

    async def test_open_store_url_gives_this_backend(self, store_url: str) -> None:
        async with await open_store(store_url) as s:
            assert isinstance(s, PostgresLog)
            assert "password" not in s.url

    async def test_followers_see_positions_in_commit_order_under_slow_and_failing_writers(
        self, store_url: str
    ) -> None:
        """Slow and rolled-back transactions from several stores never make a follower skip a position.

        A trigger in the test's schema makes inserts randomly slow and makes every event typed
        ``t.fail`` abort its whole transaction, so transactions overlap, stall and roll back while a
        follower reads by position as fast as it can. Were positions assigned outside the lock (a
        sequence, say), a later-numbered commit could be read before an earlier-numbered one and the
        follower would move past the gap for good.
        """
        import psycopg

        from loopd_es.errors import StoreUnavailableError
        from loopd_es.log.postgres_url import split_postgres_url

        async with await open_store(store_url) as setup:
            await setup.append("warm-up", [NewEvent(type="t.seed")])
        conninfo, schema = split_postgres_url(store_url)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(
                f"""
                CREATE FUNCTION {schema}.chaos() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    IF NEW.type = 't.fail' THEN RAISE EXCEPTION 'chaos: rolled back on purpose'; END IF;
                    IF random() < 0.3 THEN PERFORM pg_sleep(random() * 0.01); END IF;
                    RETURN NEW;
                END $$;
                CREATE TRIGGER chaos BEFORE INSERT ON {schema}.events FOR EACH ROW EXECUTE FUNCTION {schema}.chaos();
                """
            )
        landed: list[int] = []
        failed = 0
        seen: list[int] = []
        done = anyio.Event()

        async def writer(n: int) -> None:
            nonlocal failed
            async with await open_store(store_url) as log:
                for i in range(15):
                    kind = "t.fail" if (n + i) % 5 == 0 else "t.ok"
                    try:
                        envs = await log.append(f"w-{n}", [NewEvent(type=kind), NewEvent(type="t.ok")])
                    except StoreUnavailableError as e:
                        assert "chaos" in str(e), f"an append failed for another reason than the trigger: {e}"
                        failed += 1
                        continue
                    landed.extend(e.position for e in envs)

        async def follower() -> None:
            async with await open_store(store_url) as log:
                last = 1  # the warm-up event
                while True:
                    finished = done.is_set()
                    async for env in log.read_all(last + 1):
                        assert env.position == last + 1, f"follower skipped from {last} to {env.position}"
                        last = env.position
                        seen.append(last)
                    if finished:
                        return
                    await anyio.lowlevel.checkpoint()

        async with anyio.create_task_group() as tg:
            tg.start_soon(follower)
            async with anyio.create_task_group() as writers:
                for n in range(6):
                    writers.start_soon(writer, n)
            done.set()
        assert failed > 0, "the chaos trigger rolled nothing back: the test proves nothing"
        assert sorted(landed) == seen == list(range(2, 2 + len(landed)))

    async def test_wait_for_wakes_on_another_stores_commit(self, store: LogStore, store_url: str) -> None:
        assert isinstance(store, PostgresLog)
        assert await store.wait_for(1, timeout=0.2) is False
        woke_at: list[float] = []

        async def listening() -> int:
            """Connections on the server whose last statement was our LISTEN (other tests may listen too)."""
            import psycopg

            async with await psycopg.AsyncConnection.connect(server_url(), autocommit=True) as conn:
                cur = await conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE query = %s", (f'LISTEN "{CHANNEL}"',)
                )
                row = await cur.fetchone()
                return int(row[0]) if row else 0

        async def waiter() -> None:
            assert await store.wait_for(1, timeout=30)
            woke_at.append(anyio.current_time())

        before = await listening()
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            # the waiter LISTENs first: the wake-up must come from NOTIFY
            await await_until("the waiter to LISTEN", listening, done=lambda n: n > before)
            async with await open_store(store_url) as other:
                await other.append("s", [NewEvent(type="t.x")])
            committed_at = anyio.current_time()
        # the safety-net poll runs once a second; a wake-up well inside it came from the notification
        assert woke_at and woke_at[0] - committed_at < 0.5

    async def test_unreachable_server_is_a_storage_error(self) -> None:
        from loopd_es.errors import StoreUnavailableError

        with pytest.raises(StoreUnavailableError, match="cannot connect"):
            await open_store("postgresql://nobody@127.0.0.1:1/none?connect_timeout=1")

    async def test_a_foreign_events_table_is_refused(self, store_url: str) -> None:
        import psycopg

        from loopd_es.errors import StoreUnavailableError
        from loopd_es.log.postgres_url import split_postgres_url

        conninfo, schema = split_postgres_url(store_url)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}; CREATE TABLE {schema}.events (id int, body text)")
        with pytest.raises(StoreUnavailableError, match="not a loopd-es log"):
            await open_store(store_url)

    async def test_read_commands_do_not_create_a_log(self, store_url: str) -> None:
        from loopd_es.errors import LogNotFoundError

        with pytest.raises(LogNotFoundError):
            await open_store(store_url, create=False)


async def test_raw_line_breaks_never_reach_the_postgres_log(pg_url: str) -> None:
    """A raw payload is stored as the normalised bytes every backend stores (an export to NDJSON stays one line)."""
    import msgspec

    async with await open_store(pg_url) as s:
        recorded = await s.append("s", [NewEvent(type="t.x", data=msgspec.Raw(b'{"a":\n1}\r\n'))])
        assert bytes(recorded[0].data) == b'{"a": 1}'
        assert [bytes(e.data) async for e in s.read_all()] == [b'{"a": 1}']


async def test_many_engines_coordinating_first_on_a_new_log_all_get_an_answer(pg_url: str) -> None:
    """The first coordination calls on a log create its ``coord`` table; made at once from many stores (engines
    starting together) each gets an answer, none a catalog error. ``CREATE TABLE IF NOT EXISTS`` racing itself
    failed one of them with ``pg_type_typname_nsp_index`` on a busy CI machine before creation took the lock."""
    from loopd_es.log.coord import Claim

    for round_ in range(4):  # a fresh schema a round: the table is created by the race each time
        url = f"{pg_url}_{round_}"
        stores = [await open_store(url) for _ in range(6)]
        try:
            answers: list[Claim | None] = []

            async def contend(i: int, store: LogStore, answers: list[Claim | None]) -> None:
                claim = Claim(key="engine-lease", holder=f"e{i}", token=1, expires_us=2**62)
                answers.append(await store.coord_swap("engine-lease", 0, claim))

            async with anyio.create_task_group() as tg:
                for i, store in enumerate(stores):
                    tg.start_soon(contend, i, store, answers)
            assert len(answers) == 6 and answers.count(None) == 1, answers  # exactly one took it
        finally:
            for store in stores:
                await store.aclose()
            await _drop_schema(url.rsplit("schema=", 1)[1])


async def test_a_log_from_an_older_version_gets_the_append_function_on_its_first_append(pg_url: str) -> None:
    """A log written by an older loopd-es has its older fast-path function only; a command that opens it
    without ``create`` (``loop add``, say) installs the current one when it first appends, and the append,
    a retry of it and a conflict all answer as on a new log."""
    import psycopg

    from loopd_es.errors import WrongExpectedVersionError
    from loopd_es.log.postgres_sql import APPEND_FUNCTION_NAME
    from loopd_es.log.postgres_url import split_postgres_url

    async with await open_store(pg_url) as s:
        await s.append("a", [NewEvent(type="t.x")])
    conninfo, schema = split_postgres_url(pg_url)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"DROP FUNCTION {schema}.{APPEND_FUNCTION_NAME}")
    first = NewEvent(type="t.y")
    async with await open_store(pg_url, create=False) as s:
        recorded = await s.append("a", [first], expected_version=1)
        assert [e.position for e in recorded] == [2]
        assert await s.append("a", [first], expected_version=1) == recorded  # a retry, told as one
        with pytest.raises(WrongExpectedVersionError):
            await s.append("a", [NewEvent(type="t.z")], expected_version=1)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        found = conn.execute("SELECT to_regproc(%s)", (f"{schema}.{APPEND_FUNCTION_NAME}",)).fetchone()
        assert found is not None and found[0] is not None


async def test_a_role_that_may_not_create_functions_still_appends(pg_url: str) -> None:
    """Without the privilege to create the fast path's function, appends take the careful path: same answers."""
    import uuid

    import psycopg

    from loopd_es.log.postgres_sql import APPEND_FUNCTION_NAME
    from loopd_es.log.postgres_url import split_postgres_url

    async with await open_store(pg_url) as s:
        await s.append("a", [NewEvent(type="t.x")])
    conninfo, schema = split_postgres_url(pg_url)
    role = f"r_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"DROP FUNCTION {schema}.{APPEND_FUNCTION_NAME}")
        conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
        conn.execute(f"GRANT SELECT, INSERT ON {schema}.events TO {role}")
    try:
        limited = pg_url.replace("postgresql://postgres@", f"postgresql://{role}@", 1)
        assert limited != pg_url
        async with await open_store(limited, create=False) as s:
            event = NewEvent(type="t.y")
            recorded = await s.append("a", [event], expected_version=1)
            assert [(e.position, e.version) for e in recorded] == [(2, 2)]
            assert await s.append("a", [event]) == recorded
            assert [e.type async for e in s.read_all()] == ["t.x", "t.y"]
    finally:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")


async def _drop_schema(schema: str) -> None:
    import psycopg

    async with await psycopg.AsyncConnection.connect(server_url(), autocommit=True) as conn:
        await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


async def test_a_schema_named_in_capitals_beside_its_lower_case_twin_appends() -> None:
    """The fast path's function was looked up unquoted (``Team`` folds to ``team``): found in the twin schema,
    then called in its own, where it did not exist, and every append failed (exit 4)."""
    import uuid

    base = server_url()
    name = f"t_{uuid.uuid4().hex[:12]}"
    try:
        for schema in (name, name.upper()):
            async with await open_store(f"{base}?schema={schema}") as s:
                assert [e.position for e in await s.append("a", [NewEvent(type="t.x")])] == [1]
    finally:
        await _drop_schema(name)
        await _drop_schema(f'"{name.upper()}"')


async def test_a_role_without_privileges_on_a_log_is_told_so_not_that_there_is_none(pg_url: str) -> None:
    """information_schema hides a table from a role with no privileges on it: such a role was told "no log at
    ...; append an event first" (exit 2). The log is found, and the first read says permission is denied."""
    import uuid

    import psycopg

    from loopd_es.errors import LogNotFoundError, StorageError
    from loopd_es.log.postgres_url import split_postgres_url

    async with await open_store(pg_url) as s:
        await s.append("a", [NewEvent(type="t.x")])
    conninfo, _ = split_postgres_url(pg_url)
    role = f"r_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
    try:
        stranger = pg_url.replace("postgresql://postgres@", f"postgresql://{role}@", 1)
        assert stranger != pg_url
        with pytest.raises(StorageError, match="permission denied") as raised:
            async with await open_store(stranger, create=False) as s:
                await s.head()
        assert not isinstance(raised.value, LogNotFoundError)
        import sys

        import anyio

        ran = await anyio.run_process(
            [sys.executable, "-m", "loopd_es", "--store", stranger, "read"], check=False
        )
        assert (ran.returncode, ran.stdout) == (4, b"")  # no table header before the refusal
        assert b"permission denied" in ran.stderr and ran.stderr.count(b"\n") == 1
    finally:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")
