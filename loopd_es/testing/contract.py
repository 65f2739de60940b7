"""The behaviour every :class:`~loopd_es.log.base.LogStore` backend must have.

``LogStoreContract`` is not collected by pytest (no ``Test`` prefix); each backend subclasses it (this
repository's in ``tests/conformance/test_<backend>_log.py``, anyone else's in their own tests: see
:mod:`loopd_es.testing`) and overrides the ``store_url`` and ``store`` fixtures. Backend-specific tests live in
the subclass, never as branches here.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import pytest

from ..clock import WALL
from ..errors import (
    DuplicateEventIdError,
    UsageError,
    WrongExpectedVersionError,
)
from ..events.envelope import ANY, EXISTS, NO_STREAM, ExpectedVersion, NewEvent
from .contract_commit import CommitContract
from .contract_coord import CoordContract
from .contract_reads import ReadContract
from .helpers import assert_log_invariants as assert_log_invariants
from .helpers import batches
from .helpers import everything as everything
from .helpers import new as new
from .helpers import stream_events as stream_events

if TYPE_CHECKING:
    from ..log.base import LogStore

RFC3339_MICROS = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")


class LogStoreContract(CommitContract, ReadContract, CoordContract):
    """Every test here runs against every backend; a backend passes all of them or is wrong."""

    pytestmark = pytest.mark.anyio  # every test is async, run by anyio's pytest plugin

    @pytest.fixture
    def anyio_backend(self) -> str:
        """asyncio: what loopd-es runs on (a subclass may override it to try another backend)."""
        return "asyncio"

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
        before = WALL.now() - timedelta(seconds=2)
        recorded = await store.append("goal-1", [first, second], NO_STREAM)
        after = WALL.now() + timedelta(seconds=2)

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

    @pytest.mark.parametrize("link", ["a\x00b", "a\nb", "", "x" * 201])
    async def test_a_causal_link_every_backend_can_store_or_none(self, store: LogStore, link: str) -> None:
        """A NUL in ``causation_id`` was stored by SQLite and refused by PostgreSQL (exit 4): a log ``verify``
        called clean could not be exported. Every backend refuses it alike, as bad input."""
        for field in ("causation_id", "correlation_id"):
            event = msgspec.structs.replace(NewEvent(type="t.x", data={}), **{field: link})
            with pytest.raises(UsageError, match=field):
                await store.append("s", [event])
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
