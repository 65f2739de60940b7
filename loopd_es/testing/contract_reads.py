"""The log contract, continued: reads, verify and import, persistence across opens, concurrency.

Mixed into :class:`~loopd_es.testing.contract.LogStoreContract`, which supplies the ``store`` and ``store_url``
fixtures; it is not a contract of its own.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.lowlevel
import msgspec
import pytest

from ..errors import (
    CorruptLogError,
    DuplicateEventIdError,
    StreamNotFoundError,
    UsageError,
    WrongExpectedVersionError,
)
from ..events.envelope import ANY, NO_STREAM, Envelope, ExpectedVersion, Foldable, NewEvent
from ..log import open_store
from ..log.base import READ_BATCH, LogStore
from .helpers import assert_log_invariants as assert_log_invariants
from .helpers import batches, flat, positions
from .helpers import everything as everything
from .helpers import new as new
from .helpers import stream_events as stream_events


def _foreign_log() -> list[Envelope]:
    """Six envelopes as another log recorded them: old timestamps, links, payload bytes with odd spacing."""
    streams = ["a", "a", "b", "a", "b", "a"]
    versions = [1, 2, 1, 3, 2, 4]
    return [
        Envelope(
            position=i + 1,
            stream=streams[i],
            version=versions[i],
            event_id=str(uuid.uuid4()),
            type="t.x",
            schema_version=1 + i % 2,
            recorded_at=f"2020-01-0{i + 1}T00:00:00.00000{i}Z",
            causation_id=None if i % 2 else str(uuid.uuid4()),
            correlation_id="corr-1",
            data=msgspec.Raw(b'{"n": %d, "s": "x y"}' % i if i else b'{"n":1}'),
        )
        for i in range(6)
    ]


async def _as_batches(envs: list[Envelope], *sizes: int) -> AsyncIterator[list[Envelope]]:
    i = 0
    for size in sizes:
        yield envs[i : i + size]
        i += size
    if i < len(envs):
        yield envs[i:]


class ReadContract:
    """Reads, verify and import, persistence and concurrency (see :class:`LogStoreContract`)."""

    # -- reads -------------------------------------------------------------------------------------

    async def _ten(self, store: LogStore) -> list[Envelope]:
        """Ten events: a, b alternating (a has positions 1,3,5,7,9 and b 2,4,6,8,10)."""
        for i in range(5):
            await store.append("a", [new(i=2 * i)])
            await store.append("b", [new(i=2 * i + 1)])
        return await everything(store)

    async def test_read_batches_bounds_and_limits(self, store: LogStore) -> None:
        envs = await self._ten(store)
        assert positions(envs) == list(range(1, 11))
        assert flat(await batches(store)) == envs
        assert positions(flat(await batches(store, from_position=4))) == list(range(4, 11))
        assert positions(flat(await batches(store, from_position=4, limit=3))) == [4, 5, 6]
        assert positions(flat(await batches(store, limit=1))) == [1]
        assert flat(await batches(store, limit=0)) == []
        assert positions(flat(await batches(store, from_position=10))) == [10]
        assert flat(await batches(store, from_position=11)) == []
        assert flat(await batches(store, from_position=1000, limit=5)) == []
        assert positions(flat(await batches(store, limit=100))) == list(range(1, 11))

    async def test_read_batches_of_one_stream(self, store: LogStore) -> None:
        envs = await self._ten(store)
        a = [e for e in envs if e.stream == "a"]
        assert flat(await batches(store, stream="a")) == a
        assert [e.version for e in flat(await batches(store, stream="a", from_version=3))] == [3, 4, 5]
        assert [e.version for e in flat(await batches(store, stream="b", from_version=2, limit=2))] == [2, 3]
        assert flat(await batches(store, stream="a", from_version=6)) == []
        assert flat(await batches(store, stream="a", limit=0)) == []
        # from_position is ignored when a stream is given
        assert flat(await batches(store, stream="a", from_position=9)) == a
        assert flat(await batches(store, stream="missing")) == []

    async def test_read_recorded_is_read_batches_as_a_fold_reads_it(self, store: LogStore) -> None:
        """Whatever shape a backend gives (whole envelopes or lean rows), the same events and fields."""
        envs = await self._ten(store)

        def view(e: Foldable) -> tuple[int, str, int, str, int, str, bytes]:
            return (e.position, e.stream, e.version, e.type, e.schema_version, e.recorded_at, bytes(e.data))

        async def recorded(**kwargs: Any) -> list[tuple[int, str, int, str, int, str, bytes]]:
            return [view(e) async for batch in store.read_recorded(**kwargs) for e in batch]

        assert await recorded() == [view(e) for e in envs]
        assert await recorded(from_position=4, limit=3) == [view(e) for e in envs[3:6]]
        assert await recorded(limit=0) == []
        assert await recorded(stream="b", from_version=2, limit=2) == [
            view(e) for e in envs if e.stream == "b" and 2 <= e.version <= 3
        ]
        assert await recorded(stream="a", from_position=9) == [view(e) for e in envs if e.stream == "a"]
        assert await recorded(stream="missing") == []

    async def test_read_stream_rows_is_one_stream_as_its_fold_reads_it(self, store: LogStore) -> None:
        """The stream's events as (type, schema version, payload) from a version on, up to a position, and
        where the last one lies; in batches that tell each row's version."""
        envs = await self._ten(store)
        await store.append("a", [NewEvent(type="t.old", data={"k": 1}, schema_version=2)])
        envs = await everything(store)

        async def rows(stream: str, **kwargs: Any) -> list[tuple[int, str, int, bytes]]:
            got = []
            async for batch in store.read_stream_rows(stream, **kwargs):
                assert batch.rows and batch.last_version == batch.first_version + len(batch.rows) - 1
                last = [e for e in envs if e.stream == stream and e.version == batch.last_version]
                assert (batch.last_position, batch.last_recorded_at) == (
                    last[0].position,
                    last[0].recorded_at,
                )
                got += [(batch.first_version + k, *row) for k, row in enumerate(batch.rows)]
            return got

        def expected(stream: str, first: int = 1, until: int = 99) -> list[tuple[int, str, int, bytes]]:
            return [
                (e.version, e.type, e.schema_version, bytes(e.data))
                for e in envs
                if e.stream == stream and e.version >= first and e.position <= until
            ]

        assert await rows("a") == expected("a")
        assert (await rows("a"))[-1][1:3] == ("t.old", 2)
        assert await rows("b", from_version=3) == expected("b", first=3)
        assert await rows("a", until_position=6) == expected("a", until=6) != []
        assert await rows("b", from_version=2, until_position=7) == expected("b", first=2, until=7)
        assert await rows("a", until_position=0) == []
        assert await rows("a", from_version=7) == []
        assert await rows("missing") == []

    async def test_read_stream_rows_of_a_long_stream(self, store: LogStore) -> None:
        n = 2 * READ_BATCH + 5
        await store.append("big", [new(i=i) for i in range(n)])
        await store.append("other", [new()])
        await store.append("big", [new(i=n)])
        got = [b async for b in store.read_stream_rows("big", from_version=2)]
        assert len(got) >= 2 and sum(len(b.rows) for b in got) == n
        assert [b.first_version for b in got[1:]] == [b.last_version + 1 for b in got[:-1]]
        assert got[0].first_version == 2 and (got[-1].last_version, got[-1].last_position) == (n + 1, n + 2)
        assert [msgspec.json.decode(row[2])["i"] for b in got for row in b.rows] == list(range(1, n + 1))
        cut = [b async for b in store.read_stream_rows("big", until_position=n)]
        assert (cut[-1].last_version, sum(len(b.rows) for b in cut)) == (n, n)

    async def test_read_log_rows_is_the_whole_log_as_its_fold_reads_it(self, store: LogStore) -> None:
        """Every event up to a position exactly once: those of the asked-for prefix as rows (or, as a backend
        may choose, recorded), the rest recorded, each stream in version order; then the row streams' places."""
        await store.append("goal-1", [new(i=i) for i in range(3)])
        await store.append("goal-", [new(i=10)])  # the prefix itself names no row stream
        await store.append("goal-2", [new(i=11)])
        await store.append("cmd-1", [new(i=12), new(i=13)])
        await store.append("goal-1", [NewEvent(type="t.old", data={"i": 14}, schema_version=2)])
        await store.append("goalx", [new(i=15)])
        envs = await everything(store)

        async def read(
            until: int | None,
        ) -> tuple[list[tuple[str, str, int, bytes]], list[Any], dict[str, Any]]:
            rows: list[tuple[str, str, int, bytes]] = []
            recorded: list[Any] = []
            places: dict[str, Any] = {}
            async for batch in store.read_log_rows(rows_prefix="goal-", until_position=until):
                assert places == {}, "the places come after the last event"
                rows += batch.rows
                recorded += [
                    (e.stream, e.type, e.schema_version, bytes(e.data), e.version) for e in batch.recorded
                ]
                places.update(batch.places or {})
            return rows, recorded, places

        for until in (None, 5, 8, 0):
            rows, recorded, places = await read(until)
            kept = [e for e in envs if until is None or e.position <= until]
            assert all(r[0].startswith("goal-") and len(r[0]) > 5 for r in rows)
            assert len(rows) + len(recorded) == len(kept)
            for stream in {e.stream for e in kept}:
                mine = [(e.type, e.schema_version, bytes(e.data)) for e in kept if e.stream == stream]
                as_rows = [r[1:] for r in rows if r[0] == stream]
                as_recorded = [r[1:4] for r in recorded if r[0] == stream]
                assert mine == (as_rows or as_recorded) and not (as_rows and as_recorded), stream
                if as_rows:
                    last = [e for e in kept if e.stream == stream][-1]
                    assert places[stream] == (last.version, last.position, last.recorded_at)
            assert set(places) == {r[0] for r in rows}

    async def test_read_all_and_read_stream(self, store: LogStore) -> None:
        envs = await self._ten(store)
        assert [e async for e in store.read_all(7)] == envs[6:]
        assert [e async for e in store.read_all(2, 2)] == envs[1:3]
        assert [e async for e in store.read_all(limit=3)] == envs[:3]
        b = [e for e in envs if e.stream == "b"]
        assert await stream_events(store, "b") == b
        assert await stream_events(store, "b", 4) == b[3:]
        assert await stream_events(store, "b", 2, 1) == b[1:2]
        assert await stream_events(store, "b", 99) == []

    async def test_read_stream_of_missing_stream_raises(self, store: LogStore) -> None:
        with pytest.raises(StreamNotFoundError) as info:
            await stream_events(store, "nope")
        assert info.value.stream == "nope"
        await store.append("yes", [new()])
        with pytest.raises(StreamNotFoundError):
            await stream_events(store, "nope")

    async def test_reads_come_in_bounded_batches(self, store: LogStore) -> None:
        # bounded memory: a long read never arrives as one list (a batch may overshoot READ_BATCH by
        # what one storage read returns, so the bound checked here is "well under the whole log")
        n = 3 * READ_BATCH + 7
        events = [new(i=i) for i in range(n)]
        await store.append("big", events[: n // 2])
        await store.append("big", events[n // 2 :])
        await store.append("small", [new()])
        for kwargs in ({}, {"stream": "big"}, {"from_position": 3}):
            bs = await batches(store, **kwargs)
            sizes = [len(b) for b in bs]
            assert len(bs) >= 2 and all(sizes) and max(sizes) <= 2 * READ_BATCH, (kwargs, sizes)
        got = flat(await batches(store, stream="big"))
        assert [e.event_id for e in got] == [e.event_id for e in events]
        assert [e.version for e in got] == list(range(1, n + 1))
        assert len(flat(await batches(store, from_position=2, limit=READ_BATCH + 1))) == READ_BATCH + 1

    async def test_reading_while_appending_sees_a_prefix(self, store: LogStore) -> None:
        await store.append("s", [new(i=i) for i in range(10)])
        seen: list[Envelope] = []
        async for e in store.read_all():
            seen.append(e)
            if e.position == 5:
                await store.append("s", [new(i=99)])
        assert positions(seen)[:10] == list(range(1, 11))
        assert_log_invariants(await everything(store))
        assert await store.head() == 11

    # -- verify and import ---------------------------------------------------------------------------

    async def test_verify_a_clean_log(self, store: LogStore) -> None:
        report = await store.verify()
        assert report.ok and report.problems == [] and report.events == 0
        await store.append("a", [new(), new()])
        await store.append("b", [new()])
        for repair in (False, True):
            report = await store.verify(repair=repair)
            assert report.ok, report.problems
            assert (report.events, report.streams) == (3, 2)
            assert report.repaired == [] and report.torn_offset is None
        assert len(await everything(store)) == 3

    async def test_import_copies_envelopes_verbatim(self, store: LogStore) -> None:
        source = _foreign_log()
        assert await store.import_envelopes(_as_batches(source, 2, 1, 3)) == len(source)
        copied = await everything(store)
        assert copied == source
        assert [bytes(e.data) for e in copied] == [bytes(e.data) for e in source]
        assert await store.head() == 6
        assert await store.streams() == ["a", "b"]
        assert await store.stream_version("a") == 4
        assert await stream_events(store, "b") == [e for e in source if e.stream == "b"]
        first = source[0]
        resent = NewEvent(
            type=first.type,
            data={"n": 1},
            event_id=first.event_id,
            schema_version=first.schema_version,
            causation_id=first.causation_id,
            correlation_id=first.correlation_id,
        )
        retry = await store.append("a", [resent], 0)
        assert retry == source[:1], "an imported event id is an idempotency key like any other"
        more = await store.append("a", [new()], 4)
        assert (more[0].position, more[0].version) == (7, 5)

    async def test_import_into_a_non_empty_log_is_refused(self, store: LogStore) -> None:
        await store.append("mine", [new()])
        before = await everything(store)
        with pytest.raises(UsageError):
            await store.import_envelopes(_as_batches(_foreign_log(), 6))
        assert await everything(store) == before

    @pytest.mark.parametrize("flaw", ["position gap", "starts at 2", "version jump", "version restarts"])
    async def test_import_of_a_broken_log_leaves_the_target_empty(self, store: LogStore, flaw: str) -> None:
        source = _foreign_log()
        if flaw == "position gap":
            source[4:] = [msgspec.structs.replace(e, position=e.position + 1) for e in source[4:]]
        elif flaw == "starts at 2":
            source = [msgspec.structs.replace(e, position=e.position + 1) for e in source]
        elif flaw == "version jump":
            source[5] = msgspec.structs.replace(source[5], version=3)
        else:
            source[5] = msgspec.structs.replace(source[5], version=1)
        with pytest.raises(CorruptLogError):
            await store.import_envelopes(_as_batches(source, 2, 2, 2))
        assert await everything(store) == []
        assert await store.head() == 0
        assert await store.streams() == []
        assert await store.stream_version("a") == 0
        again = await store.import_envelopes(_as_batches(_foreign_log(), 6))
        assert again == 6

    # -- persistence and sharing -------------------------------------------------------------------

    async def test_reopen_preserves_contents(self, store_url: str) -> None:
        async with await open_store(store_url) as first:
            await first.append("a", [new(i=1), new(i=2)])
            await first.append(
                "b", [NewEvent(type="t.x", data={"x": 1}, causation_id="c", correlation_id="r")]
            )
            written = await everything(first)
        async with await open_store(store_url) as second:
            assert await everything(second) == written
            assert await second.head() == 3
            assert await second.streams() == ["a", "b"]
            assert await second.stream_version("a") == 2
            more = await second.append("a", [new(i=3)], 2)
            assert (more[0].position, more[0].version) == (4, 3)
        async with await open_store(store_url) as third:
            assert await everything(third) == [*written, *more]
            assert await stream_events(third, "a") == [*written[:2], *more]

    async def test_two_open_stores_see_each_others_appends(self, store: LogStore, store_url: str) -> None:
        await store.append("s", [new(i=1)])
        async with await open_store(store_url) as other:
            assert await other.stream_version("s") == 1
            mine = await other.append("s", [new(i=2)], 1)
            assert (mine[0].position, mine[0].version) == (2, 2)
            theirs = await store.append("s", [new(i=3)], 2)
            assert (theirs[0].position, theirs[0].version) == (3, 3)
            assert await store.head() == 3 and await other.head() == 3
            with pytest.raises(WrongExpectedVersionError) as info:
                await other.append("s", [new(i=4)], 2)
            assert info.value.actual == 3
            assert await everything(other) == await everything(store)
            assert_log_invariants(await everything(store))

    # -- concurrency -------------------------------------------------------------------------------

    async def test_concurrent_appends_serialise(self, store: LogStore) -> None:
        tasks, rounds = 16, 12
        acked: list[Envelope] = []

        async def writer(w: int) -> None:
            private = f"private-{w}"
            for r in range(rounds):
                acked.extend(await store.append("shared", [new(w=w, r=r)], ANY))
                acked.extend(await store.append(private, [new(w=w, r=r), new(w=w, r=r, second=True)], 2 * r))
                if r % 4 == 0:
                    await anyio.lowlevel.checkpoint()

        async with anyio.create_task_group() as tg:
            for w in range(tasks):
                tg.start_soon(writer, w)
        envs = await everything(store)
        assert len(envs) == tasks * rounds * 3
        assert_log_invariants(envs)
        assert sorted(acked, key=lambda e: e.position) == envs
        assert await store.stream_version("shared") == tasks * rounds
        for w in range(tasks):
            assert await store.stream_version(f"private-{w}") == 2 * rounds
            mine = [e.data_dict()["r"] for e in envs if e.stream == f"private-{w}"]
            assert mine == [r for r in range(rounds) for _ in (0, 1)]

    async def test_concurrent_expected_version_race_has_one_winner(self, store: LogStore) -> None:
        async def contender(
            w: int,
            stream: str,
            expected: ExpectedVersion,
            outcomes: list[Envelope | WrongExpectedVersionError],
        ) -> None:
            try:
                outcomes.append((await store.append(stream, [new(w=w), new(w=w)], expected))[0])
            except WrongExpectedVersionError as e:
                outcomes.append(e)

        rounds: list[ExpectedVersion] = [NO_STREAM, 0, 1]
        for rnd, expected in enumerate(rounds):
            stream = f"race-{rnd}"
            if expected == 1:
                await store.append(stream, [new()])
            base = await store.head()
            outcomes: list[Envelope | WrongExpectedVersionError] = []
            async with anyio.create_task_group() as tg:
                for w in range(16):
                    tg.start_soon(contender, w, stream, expected, outcomes)
            wins = [o for o in outcomes if isinstance(o, Envelope)]
            losses = [o for o in outcomes if isinstance(o, WrongExpectedVersionError)]
            assert len(outcomes) == 16 and len(wins) == 1, outcomes
            final = 2 if expected != 1 else 3
            assert all(e.actual == final and e.stream == stream for e in losses)
            assert await store.stream_version(stream) == final
            assert await store.head() == base + 2
            assert wins[0].position == base + 1
        assert_log_invariants(await everything(store))

    async def test_one_group_commit_gives_each_append_its_own_outcome(self, store: LogStore) -> None:
        """Appends that land in one group commit: new, exact retry, stale version, reused id, within-group race."""
        first = [new(k=1), new(k=2)]
        original = await store.append("retried", first, NO_STREAM)
        taken = await store.append("taken", [new(k=3)])
        reused = NewEvent(type="test.other", data={"k": 4}, event_id=taken[0].event_id)
        twin = new(k=5)
        outcomes: dict[str, list[Envelope] | Exception] = {}

        async def attempt(name: str, stream: str, events: list[NewEvent], expected: ExpectedVersion) -> None:
            try:
                outcomes[name] = await store.append(stream, events, expected)
            except Exception as e:  # the outcome under test
                outcomes[name] = e

        base = await store.head()
        async with anyio.create_task_group() as tg:  # started together: they share a group commit
            tg.start_soon(attempt, "new", "fresh", [new(k=6), new(k=7)], NO_STREAM)
            tg.start_soon(attempt, "retry", "retried", first, NO_STREAM)
            tg.start_soon(attempt, "stale", "taken", [new(k=8)], 0)
            tg.start_soon(attempt, "reused", "other", [reused], ANY)
            tg.start_soon(attempt, "twin-a", "twins", [twin], ANY)
            tg.start_soon(attempt, "twin-b", "twins", [twin], ANY)
        assert outcomes["retry"] == original
        assert isinstance(outcomes["stale"], WrongExpectedVersionError)
        assert isinstance(outcomes["reused"], DuplicateEventIdError)
        fresh = outcomes["new"]
        assert isinstance(fresh, list) and [e.version for e in fresh] == [1, 2]
        twin_a, twin_b = outcomes["twin-a"], outcomes["twin-b"]
        assert isinstance(twin_a, list) and twin_a == twin_b, "a concurrent exact retry returns the original"
        envs = await everything(store)
        assert len(envs) == base + 3  # the two fresh events and one twin, nothing else
        assert_log_invariants(envs)

    async def test_a_group_of_fresh_ids_still_checks_each_expected_version(self, store: LogStore) -> None:
        await store.append("s", [new()])
        outcomes: dict[int, list[Envelope] | Exception] = {}

        async def attempt(k: int, expected: ExpectedVersion) -> None:
            try:
                outcomes[k] = await store.append(f"s{k % 2}" if k else "s", [new(k=k)], expected)
            except WrongExpectedVersionError as e:
                outcomes[k] = e

        async with anyio.create_task_group() as tg:
            tg.start_soon(attempt, 0, 0)  # stale: "s" is at version 1
            for k in range(1, 9):
                tg.start_soon(attempt, k, ANY)
        assert isinstance(outcomes[0], WrongExpectedVersionError) and outcomes[0].actual == 1
        assert all(isinstance(outcomes[k], list) for k in range(1, 9))
        envs = await everything(store)
        assert len(envs) == 9
        assert_log_invariants(envs)
