"""The behaviour every :class:`~loopd_es.log.base.LogStore` backend must have.

``LogStoreContract`` is not collected by pytest (no ``Test`` prefix); each backend subclasses it in
``test_<backend>_log.py`` and overrides the ``store_url`` and ``store`` fixtures. Backend-specific tests live in
the subclass, never as branches here.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import msgspec
import pytest

from loopd_es.errors import (
    CorruptLogError,
    DuplicateEventIdError,
    StreamNotFoundError,
    UsageError,
    WrongExpectedVersionError,
)
from loopd_es.events.envelope import ANY, EXISTS, NO_STREAM, Envelope, ExpectedVersion, NewEvent
from loopd_es.log import open_store
from loopd_es.log.base import READ_BATCH, LogStore

from .contract_commit import CommitContract
from .contract_helpers import assert_log_invariants as assert_log_invariants
from .contract_helpers import batches, flat, positions
from .contract_helpers import everything as everything
from .contract_helpers import new as new
from .contract_helpers import stream_events as stream_events

RFC3339_MICROS = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")


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


class LogStoreContract(CommitContract):
    """Every test here runs against every backend; a backend passes all of them or is wrong."""

    @pytest.fixture
    def store_url(self, tmp_path: Path) -> str:
        """The URL of a fresh, empty log in ``tmp_path`` (overridden per backend)."""
        raise NotImplementedError

    @pytest.fixture
    async def store(self, store_url: str) -> AsyncIterator[LogStore]:
        """An open store on ``store_url`` (overridden per backend)."""
        raise NotImplementedError
        yield  # pragma: no cover

    # -- empty log ---------------------------------------------------------------------------------

    async def test_empty_log(self, store: LogStore) -> None:
        assert await store.head() == 0
        assert await store.streams() == []
        assert await store.stream_version("nothing") == 0
        assert await everything(store) == []
        assert await batches(store) == []
        assert await batches(store, stream="nothing") == []

    # -- round trip --------------------------------------------------------------------------------

    async def test_append_round_trips_every_field(self, store: LogStore) -> None:
        cause, corr = str(uuid.uuid4()), str(uuid.uuid4())
        first = NewEvent(
            type="goal.created",
            data={"name": "ship it", "nested": {"list": [1, 2.5, None, True], "text": 'é ✓ \n "q"'}},
            schema_version=3,
            causation_id=cause,
            correlation_id=corr,
        )
        second = NewEvent(type="goal.renamed", data={}, causation_id=first.event_id)
        before = datetime.now(UTC) - timedelta(seconds=2)
        recorded = await store.append("goal-1", [first, second], NO_STREAM)
        after = datetime.now(UTC) + timedelta(seconds=2)

        assert len(recorded) == 2
        a, b = recorded
        assert (a.position, a.stream, a.version) == (1, "goal-1", 1)
        assert (b.position, b.stream, b.version) == (2, "goal-1", 2)
        assert a.event_id == first.event_id and b.event_id == second.event_id
        assert a.type == "goal.created" and b.type == "goal.renamed"
        assert a.schema_version == 3 and b.schema_version == 1
        assert (a.causation_id, a.correlation_id) == (cause, corr)
        assert (b.causation_id, b.correlation_id) == (first.event_id, None)
        assert a.data_dict() == first.data and b.data_dict() == {}
        for env in recorded:
            assert RFC3339_MICROS.match(env.recorded_at), env.recorded_at
            at = datetime.strptime(env.recorded_at, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
            assert before <= at <= after

        assert await everything(store) == recorded
        assert await stream_events(store, "goal-1") == recorded

    async def test_default_event_ids_are_uuids_and_kept(self, store: LogStore) -> None:
        events = [new(n=i) for i in range(3)]
        recorded = await store.append("s", events)
        assert [e.event_id for e in recorded] == [e.event_id for e in events]
        for e in recorded:
            uuid.UUID(e.event_id)

    async def test_payload_forms_round_trip(self, store: LogStore) -> None:
        class Payload(msgspec.Struct, frozen=True, kw_only=True):
            goal_id: str
            turns: int

        big = "x" * 200_000
        recorded = await store.append(
            "p",
            [
                NewEvent(type="t.struct", data=Payload(goal_id="g", turns=3)),
                NewEvent(type="t.raw", data=msgspec.Raw(b'{"a":[1,{"b":null}]}')),
                NewEvent(type="t.bytes", data=b'{"k":"v"}'),
                NewEvent(type="t.big", data={"big": big}),
                NewEvent(type="t.unicode", data={"s": "\u2028\u2029\x00\ud7ff😀"}),
            ],
        )
        read = await everything(store)
        assert read == recorded
        assert [e.data_dict() for e in read] == [
            {"goal_id": "g", "turns": 3},
            {"a": [1, {"b": None}]},
            {"k": "v"},
            {"big": big},
            {"s": "\u2028\u2029\x00\ud7ff😀"},
        ]

    async def test_positions_gapless_and_versions_per_stream(self, store: LogStore) -> None:
        await store.append("a", [new(), new()])
        await store.append("b", [new()])
        await store.append("a", [new()], 2)
        await store.append("c", [new(), new(), new()], NO_STREAM)
        await store.append("b", [new()], EXISTS)
        envs = await everything(store)
        assert [(e.position, e.stream, e.version) for e in envs] == [
            (1, "a", 1),
            (2, "a", 2),
            (3, "b", 1),
            (4, "a", 3),
            (5, "c", 1),
            (6, "c", 2),
            (7, "c", 3),
            (8, "b", 2),
        ]
        assert_log_invariants(envs)
        assert await store.head() == 8
        assert [await store.stream_version(s) for s in ("a", "b", "c", "d")] == [3, 2, 3, 0]
        assert await store.streams() == ["a", "b", "c"]

    async def test_streams_sorted_by_name(self, store: LogStore) -> None:
        for name in ("zeta", "Alpha", "goal-10", "goal-2", "ümlaut", "a b"):
            await store.append(name, [new()])
        assert await store.streams() == sorted(["zeta", "Alpha", "goal-10", "goal-2", "ümlaut", "a b"])

    # -- atomic batches ----------------------------------------------------------------------------

    async def test_conflicting_batch_writes_nothing(self, store: LogStore) -> None:
        await store.append("s", [new(i=1)])
        before = await everything(store)
        with pytest.raises(WrongExpectedVersionError):
            await store.append("s", [new(i=2), new(i=3), new(i=4)], 0)
        with pytest.raises(WrongExpectedVersionError):
            await store.append("t", [new(i=5), new(i=6)], EXISTS)
        assert await everything(store) == before
        assert await store.head() == 1
        assert await store.stream_version("s") == 1
        assert await store.stream_version("t") == 0
        assert await store.streams() == ["s"]
        nxt = await store.append("s", [new(i=7)], 1)
        assert (nxt[0].position, nxt[0].version) == (2, 2)

    async def test_batch_mixing_recorded_and_new_ids_writes_nothing(self, store: LogStore) -> None:
        old = new(i=1)
        await store.append("s", [old])
        with pytest.raises(DuplicateEventIdError):
            await store.append("s", [old, new(i=2)])
        with pytest.raises(DuplicateEventIdError):
            await store.append("s", [new(i=3), old])
        assert [e.event_id for e in await everything(store)] == [old.event_id]

    async def test_same_id_twice_in_one_batch_is_refused(self, store: LogStore) -> None:
        e = new(i=1)
        with pytest.raises((DuplicateEventIdError, UsageError)):
            await store.append("s", [e, e])
        assert await everything(store) == []
        assert await store.streams() == []

    @pytest.mark.parametrize(
        ("stream", "type_", "expected"),
        [
            ("", "t.x", ANY),
            ("a\nb", "t.x", ANY),
            ("x" * 201, "t.x", ANY),
            ("s", "t.x", -1),
            ("s", "t.x", "sometimes"),
            ("s", "t.x", True),
            ("s", "", ANY),
        ],
        ids=["empty-stream", "newline-stream", "long-stream", "negative-version", "word-version",
             "bool-version", "empty-type"],
    )  # fmt: skip
    async def test_invalid_input_is_a_usage_error_and_writes_nothing(
        self, store: LogStore, stream: str, type_: str, expected: Any
    ) -> None:
        with pytest.raises(UsageError):
            await store.append(stream, [NewEvent(type=type_, data={})], expected)
        assert await everything(store) == []
        assert await store.streams() == []

    @pytest.mark.parametrize("event_id", ["not-a-uuid", "", "zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz"])
    async def test_event_id_must_be_a_uuid(self, store: LogStore, event_id: str) -> None:
        with pytest.raises(UsageError):
            await store.append("s", [new(), NewEvent(type="t.x", data={}, event_id=event_id)])
        assert await everything(store) == []

    async def test_event_ids_sharing_a_prefix_are_distinct(self, store: LogStore) -> None:
        # ids equal in their first 16 hex digits (what a 64-bit index key might keep) are still different ids
        a = NewEvent(type="t.x", data={"n": 1}, event_id="0123abcd-4567-4890-8000-000000000001")
        b = NewEvent(type="t.x", data={"n": 2}, event_id="0123abcd-4567-4890-8000-000000000002")
        c = NewEvent(type="t.x", data={"n": 3}, event_id="0123abcd-4567-4890-9fff-ffffffffffff")
        first = await store.append("s", [a])
        second = await store.append("s", [b, c])
        assert [e.version for e in first + second] == [1, 2, 3]
        assert await store.append("s", [b]) == second[:1]
        assert await store.append("s", [a], NO_STREAM) == first
        with pytest.raises(DuplicateEventIdError):
            await store.append("s", [msgspec.structs.replace(c, data={"n": 4})])
        assert await store.head() == 3

    # -- expected versions -------------------------------------------------------------------------

    @pytest.mark.parametrize(
        ("existing", "expected", "ok"),
        [
            (0, 0, True),
            (0, 1, False),
            (0, NO_STREAM, True),
            (0, EXISTS, False),
            (0, ANY, True),
            (3, 3, True),
            (3, 0, False),
            (3, 2, False),
            (3, 4, False),
            (3, NO_STREAM, False),
            (3, EXISTS, True),
            (3, ANY, True),
        ],
    )
    async def test_expected_version(
        self, store: LogStore, existing: int, expected: ExpectedVersion, ok: bool
    ) -> None:
        await store.append("other", [new()])  # another stream, so global positions differ from versions
        if existing:
            await store.append("s", [new() for _ in range(existing)])
        before = await everything(store)
        events = [new(), new()]
        if ok:
            recorded = await store.append("s", events, expected)
            assert [e.version for e in recorded] == [existing + 1, existing + 2]
            assert [e.position for e in recorded] == [len(before) + 1, len(before) + 2]
            assert await store.stream_version("s") == existing + 2
            assert await everything(store) == before + recorded
        else:
            with pytest.raises(WrongExpectedVersionError) as info:
                await store.append("s", events, expected)
            err = info.value
            assert (err.stream, err.expected, err.actual) == ("s", expected, existing)
            assert "'s'" in str(err)
            assert await everything(store) == before
            assert await store.stream_version("s") == existing

    async def test_conflict_error_is_a_conflict(self, store: LogStore) -> None:
        await store.append("goal-7", [new()])
        with pytest.raises(WrongExpectedVersionError) as info:
            await store.append("goal-7", [new()], NO_STREAM)
        assert info.value.exit_code == 3
        assert "goal-7" in str(info.value) and "1" in str(info.value)

    # -- idempotency -------------------------------------------------------------------------------

    async def test_retry_returns_original_envelopes(self, store: LogStore) -> None:
        batch = [new(i=1), new(i=2)]
        original = await store.append("s", batch, NO_STREAM)
        for expected in (NO_STREAM, 0, ANY, EXISTS, 2, 99):
            again = await store.append("s", batch, expected)
            assert again == original, expected
        assert await everything(store) == original
        assert await store.head() == 2

    async def test_retry_after_the_stream_moved_on(self, store: LogStore) -> None:
        batch = [new(i=1)]
        original = await store.append("s", batch, 0)
        later = await store.append("s", [new(i=2)], 1)
        await store.append("t", [new(i=3)])
        assert await store.append("s", batch, 0) == original
        assert await store.append("s", batch[:], NO_STREAM) == original
        envs = await everything(store)
        assert envs == original + later + envs[2:]
        assert len(envs) == 3

    async def test_retry_of_part_of_a_batch(self, store: LogStore) -> None:
        batch = [new(i=1), new(i=2), new(i=3)]
        original = await store.append("s", batch)
        assert await store.append("s", batch[1:2], 0) == original[1:2]
        assert await store.append("s", batch[1:]) == original[1:]
        assert await store.head() == 3

    async def test_retry_with_reordered_json_keys_is_identical(self, store: LogStore) -> None:
        event_id = str(uuid.uuid4())
        first = NewEvent(type="t.x", data=msgspec.Raw(b'{"a":1,"b":[2,3]}'), event_id=event_id)
        original = await store.append("s", [first])
        again = NewEvent(type="t.x", data={"b": [2, 3], "a": 1}, event_id=event_id)
        assert await store.append("s", [again]) == original
        assert await store.head() == 1

    @pytest.mark.parametrize(
        "change",
        [
            {"data": {"i": 2}},
            {"type": "test.other"},
            {"schema_version": 2},
            {"causation_id": "c-1"},
            {"correlation_id": "r-1"},
            {"stream": "elsewhere"},
        ],
    )
    async def test_same_id_different_content_is_refused(
        self, store: LogStore, change: dict[str, Any]
    ) -> None:
        event_id = str(uuid.uuid4())
        original = NewEvent(type="test.happened", data={"i": 1}, event_id=event_id)
        await store.append("s", [original])
        await store.append("s", [new(i=9)])
        fields: dict[str, Any] = {
            "type": original.type,
            "data": original.data,
            "event_id": event_id,
            "schema_version": original.schema_version,
            "causation_id": original.causation_id,
            "correlation_id": original.correlation_id,
        }
        change = dict(change)  # the parameter is shared by every backend's run of this test
        stream = change.pop("stream", "s")
        fields.update(change)
        before = await everything(store)
        with pytest.raises(DuplicateEventIdError) as info:
            await store.append(stream, [NewEvent(**fields)])
        assert info.value.event_id == event_id
        assert info.value.position == 1
        assert await everything(store) == before

    # -- empty appends -----------------------------------------------------------------------------

    async def test_empty_append_writes_nothing(self, store: LogStore) -> None:
        assert await store.append("s", []) == []
        assert await store.append("s", [], NO_STREAM) == []
        assert await store.head() == 0
        assert await store.streams() == []
        await store.append("t", [new()])
        assert await store.append("t", [], 1) == []
        assert await store.append("t", []) == []
        assert await store.head() == 1
        assert await store.stream_version("t") == 1

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
