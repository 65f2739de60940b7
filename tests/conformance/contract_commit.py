"""Contract, part two: group commit under shared failure and cancellation, multi-stream appends, filtered reads.

A mixin of :class:`~tests.conformance.contract.LogStoreContract`; every backend runs it.
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest

from loopd_es.errors import DuplicateEventIdError, StreamNotFoundError, UsageError, WrongExpectedVersionError
from loopd_es.events.envelope import ANY, NO_STREAM, Envelope, NewEvent
from loopd_es.log.base import LogStore, StreamWrite

from .contract_helpers import assert_log_invariants, everything, new


class _Unencodable:
    """A payload value msgspec cannot encode."""


async def _cancel_round(
    store: LogStore, prefix: str, writers: int, chosen: set[int], turns: int
) -> tuple[dict[int, list[Envelope]], set[int]]:
    """Start ``writers`` appends at once and cancel those in ``chosen`` after ``turns`` event-loop turns.

    Returns what each append returned and which ones raised the cancellation.
    """
    returned: dict[int, list[Envelope]] = {}
    cancelled: set[int] = set()
    scopes = [anyio.CancelScope() for _ in range(writers)]

    async def writer(w: int) -> None:
        with scopes[w]:
            returned[w] = await store.append(f"{prefix}-{w}", [new(w=w), new(w=w, second=True)], NO_STREAM)
        if scopes[w].cancelled_caught:
            cancelled.add(w)

    async def canceller() -> None:
        for _ in range(turns):
            await anyio.lowlevel.checkpoint()
        for w in chosen:
            scopes[w].cancel()

    with anyio.fail_after(10):  # a stranded follower would hang here
        async with anyio.create_task_group() as tg:
            for w in range(writers):
                tg.start_soon(writer, w)
            tg.start_soon(canceller)
    return returned, cancelled


class CommitContract:
    """Shared failure, cancellation, append_many, filters, backwards reads and wait_for."""

    # -- shared failure ----------------------------------------------------------------------------

    async def test_an_unencodable_payload_fails_only_its_own_append(self, store: LogStore) -> None:
        outcomes: dict[int, list[Envelope] | Exception] = {}

        async def attempt(k: int) -> None:
            data: dict[str, Any] = {"k": k, "bad": _Unencodable()} if k == 3 else {"k": k}
            try:
                outcomes[k] = await store.append(f"s{k}", [NewEvent(type="t.x", data=data)])
            except Exception as e:  # the outcome under test
                outcomes[k] = e

        async with anyio.create_task_group() as tg:  # started together: they would share a group commit
            for k in range(8):
                tg.start_soon(attempt, k)
        bad = outcomes.pop(3)
        assert isinstance(bad, UsageError) and "event 1 of the batch" in str(bad), bad
        envs = await everything(store)
        assert len(envs) == 7
        for k, outcome in outcomes.items():
            assert isinstance(outcome, list) and len(outcome) == 1, (k, outcome)
            assert outcome[0].data_dict() == {"k": k}
            assert envs[outcome[0].position - 1] == outcome[0]

    # -- cancellation ------------------------------------------------------------------------------

    @pytest.mark.parametrize("victims", ["first", "second", "odd", "all"])
    async def test_cancellation_at_every_await_strands_nobody_and_tells_the_truth(
        self, store: LogStore, victims: str
    ) -> None:
        """Cancel some appenders after k event-loop turns, for every k until nothing is left to cancel.

        Nobody hangs; a cancelled append that returned landed, one that raised the cancellation did not.
        """
        writers = 6
        chosen = {"first": {0}, "second": {1}, "odd": {1, 3, 5}, "all": set(range(writers))}[victims]
        for k in range(14):
            returned, cancelled = await _cancel_round(store, f"c{k}", writers, chosen, k)
            assert set(returned) | cancelled == set(range(writers))
            assert not set(returned) & cancelled
            assert set(returned) >= set(range(writers)) - chosen
            envs = await everything(store)
            assert_log_invariants(envs)
            for w in range(writers):
                stream = [e for e in envs if e.stream == f"c{k}-{w}"]
                if w in returned:
                    assert stream == returned[w], f"k={k} writer {w}: acknowledged but not as recorded"
                else:
                    assert stream == [], f"k={k} writer {w}: told cancelled, yet its events landed"
            if not cancelled and k > 4:
                break  # everything completed before the cancellation: later k add nothing

    async def test_a_cancelled_appender_leaves_the_store_usable(self, store: LogStore) -> None:
        with anyio.CancelScope() as scope:
            scope.cancel()
            await store.append("s", [new()])
        assert scope.cancelled_caught
        assert await store.append("s", [new(), new()], 0) != []
        assert await store.stream_version("s") == 2

    # -- append_many -------------------------------------------------------------------------------

    async def test_append_many_lands_every_write_contiguously(self, store: LogStore) -> None:
        await store.append("other", [new()])
        a, b, c = await store.append_many(
            [
                StreamWrite("a", [new(n=1), new(n=2)], NO_STREAM),
                StreamWrite("b", [new(n=3)]),
                ("other", [new(n=4)], 1),
            ]
        )
        assert [e.position for e in a + b + c] == [2, 3, 4, 5]
        assert [(e.stream, e.version) for e in a + b + c] == [("a", 1), ("a", 2), ("b", 1), ("other", 2)]
        envs = await everything(store)
        assert envs[1:] == a + b + c
        assert_log_invariants(envs)

    async def test_append_many_with_one_stale_version_writes_nothing(self, store: LogStore) -> None:
        await store.append("a", [new()])
        with pytest.raises(WrongExpectedVersionError) as info:
            await store.append_many([("fresh", [new()], NO_STREAM), ("a", [new()], 0), ("b", [new()], ANY)])
        assert info.value.stream == "a" and info.value.actual == 1
        assert len(await everything(store)) == 1
        assert await store.stream_version("fresh") == 0

    async def test_append_many_retry_returns_the_originals(self, store: LogStore) -> None:
        writes = [StreamWrite("a", [new(), new()], NO_STREAM), StreamWrite("b", [new()], NO_STREAM)]
        first = await store.append_many(writes)
        await store.append("a", [new()])
        assert await store.append_many(writes) == first
        assert len(await everything(store)) == 4

    async def test_append_many_mixing_recorded_and_new_ids_writes_nothing(self, store: LogStore) -> None:
        recorded = await store.append("a", [new()])
        again = NewEvent(type="test.happened", data={}, event_id=recorded[0].event_id)
        with pytest.raises(DuplicateEventIdError):
            await store.append_many([("a", [again]), ("b", [new()])])
        assert len(await everything(store)) == 1

    @pytest.mark.parametrize(
        "writes",
        [[], [("a", [new()]), ("a", [new()])], [("a", [])], [("", [new()])], [("a", [new()], "sometimes")]],
        ids=["none", "stream-twice", "empty-write", "bad-stream", "bad-version"],
    )
    async def test_append_many_refuses_bad_input(self, store: LogStore, writes: list[Any]) -> None:
        with pytest.raises(UsageError):
            await store.append_many(writes)
        assert await store.head() == 0

    async def test_concurrent_append_many_and_appends_share_groups(self, store: LogStore) -> None:
        results: list[list[Envelope]] = []

        async def pair(k: int) -> None:
            results.extend(await store.append_many([(f"p{k}", [new(k=k)], NO_STREAM), (f"q{k}", [new(k=k)])]))

        async def single(k: int) -> None:
            results.append(await store.append(f"shared-{k % 3}", [new(k=k)], ANY))

        async with anyio.create_task_group() as tg:
            for k in range(10):
                tg.start_soon(pair, k)
                tg.start_soon(single, 100 + k)
        envs = await everything(store)
        assert_log_invariants(envs)
        assert sorted((e for r in results for e in r), key=lambda e: e.position) == envs
        for k in range(10):  # each pair is contiguous
            p, q = (next(e for e in envs if e.stream == f"{s}{k}" and e.data_dict()["k"] == k) for s in "pq")
            assert q.position == p.position + 1

    # -- filters, backwards, wait_for --------------------------------------------------------------

    async def test_read_all_filters_by_type_and_stream_prefix(self, store: LogStore) -> None:
        for k in range(30):
            await store.append(
                f"{'goal' if k % 3 else 'run'}-{k % 4}", [NewEvent(type=f"t.k{k % 5}", data={"k": k})]
            )
        envs = await everything(store)
        kept = [e async for e in store.read_all(types=["t.k1", "t.k3"])]
        assert kept == [e for e in envs if e.type in ("t.k1", "t.k3")]
        kept = [e async for e in store.read_all(5, limit=4, stream_prefix="goal-")]
        assert kept == [e for e in envs if e.stream.startswith("goal-") and e.position >= 5][:4]
        kept = [e async for e in store.read_all(types=["t.k2"], stream_prefix="run")]
        assert kept == [e for e in envs if e.type == "t.k2" and e.stream.startswith("run")]
        assert [e async for e in store.read_all(types=[])] == []

    async def test_read_backwards_and_last_n(self, store: LogStore) -> None:
        for k in range(25):
            await store.append(f"s{k % 2}", [new(k=k)])
        envs = await everything(store)
        back = [e for b in [b async for b in store.read_backwards(stream="s0", limit=5)] for e in b]
        assert back == [e for e in reversed(envs) if e.stream == "s0"][:5]
        back = [e for b in [b async for b in store.read_backwards(stream="s1", start=4)] for e in b]
        assert [e.version for e in back] == [4, 3, 2, 1]
        back = [e for b in [b async for b in store.read_backwards()] for e in b]
        assert back == envs[::-1]
        with pytest.raises(StreamNotFoundError):
            [b async for b in store.read_backwards(stream="nope")]

    async def test_wait_for_returns_when_the_log_passes_a_position(self, store: LogStore) -> None:
        await store.append("s", [new()])
        assert await store.wait_for(1, timeout=0)
        assert not await store.wait_for(2, timeout=0.05)
        reached: list[bool] = []
        async with anyio.create_task_group() as tg:

            async def waiter() -> None:
                reached.append(await store.wait_for(3, timeout=10))

            tg.start_soon(waiter)
            await anyio.lowlevel.checkpoint()
            await store.append("s", [new()])
            assert reached == []
            await store.append("s", [new()])
        assert reached == [True]
