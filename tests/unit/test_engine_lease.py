"""The engine lease as a coordination record beside the log: one holder at a time, takeover only after expiry,
a holder that lost it neither writes nor prompts, and the lease itself writes no event (only a takeover does)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from loopd_es.engine.core import Engine, EngineConfig
from loopd_es.engine.lease import Lease, LeaseLostError

from ._engine_harness import rig

pytestmark = pytest.mark.anyio


async def test_one_holder_takeover_after_expiry_and_release(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        a = Lease(r.store, "a", r.clock, ttl_ms=10_000)
        b = Lease(r.store, "b", r.clock, ttl_ms=10_000)
        assert await a.try_acquire() is None and a.token == 1
        holder = await b.try_acquire()
        assert holder is not None and holder.holder == "a"
        r.clock.advance(6)
        await a.renew()  # renewed at 6 s: now valid until 16 s
        r.clock.advance(6)
        assert await b.try_acquire() is not None
        r.clock.advance(5)
        assert await b.try_acquire() is None and b.token == 2  # the token moves at each acquisition only
        with pytest.raises(LeaseLostError):
            await a.check()
        with pytest.raises(LeaseLostError):
            await a.renew()
        await b.release()
        assert await a.try_acquire() is None  # a released lease is free at once
        facts = [e.data_dict() async for e in r.store.read_all()]
        assert [f["previous_holder"] for f in facts] == ["a"], "only b's takeover from a is history"
        assert facts[0]["holder"] == "b"


async def test_an_engine_that_lost_its_lease_sends_no_prompt(tmp_path: Path) -> None:
    async with rig(tmp_path, config=EngineConfig(confirm_idle_ms=0)) as r:
        gid, sid = await r.started()
        old = Lease(r.store, "old", r.clock, ttl_ms=5_000)
        assert await old.try_acquire() is None
        engine = Engine(r.store, r.host, r.clock, EngineConfig(confirm_idle_ms=0), guard=old.check)
        await engine.start()
        r.clock.advance(6)  # the old holder stalled past its lease; another engine takes over
        assert await Lease(r.store, "new", r.clock).try_acquire() is None
        await r.host.reply(sid)
        head = await r.store.head()
        with pytest.raises(LeaseLostError):
            for event in list(r.seen):
                await engine.on_host_event(event)
        assert await r.store.head() == head
        assert len(await r.prompts(sid)) == 1


async def test_the_fence_refuses_a_write_of_an_old_holder_even_without_its_check(tmp_path: Path) -> None:
    from loopd_es.engine.fence import FencedStore

    async with rig(tmp_path, config=EngineConfig(confirm_idle_ms=0)) as r:
        gid, sid = await r.started()
        old = Lease(r.store, "old", r.clock, ttl_ms=5_000)
        assert await old.try_acquire() is None
        engine = Engine(
            FencedStore(r.store, old), r.host, r.clock, EngineConfig(confirm_idle_ms=0)
        )  # no guard
        await engine.start()
        await r.host.reply(sid)
        head = await r.store.head()
        await engine.on_host_event(r.seen.pop(0))  # the answer: usage accounted, fenced with token 1
        written = [e async for e in r.store.read_all(head + 1)]
        assert written and not any(e.type.startswith("engine.") for e in written), "a fence writes nothing"
        r.clock.advance(6)
        assert (
            await Lease(r.store, "new", r.clock).try_acquire() is None
        )  # the old holder stalled; taken over

        async def paused_between_check_and_write(goal_id: str | None = None) -> None:
            """Every check passes: the old holder checked just before the takeover, then wrote after it."""

        old.check = paused_between_check_and_write  # type: ignore[method-assign]
        old.expires_at = r.clock.now() + timedelta(seconds=60)
        head = await r.store.head()
        with pytest.raises(LeaseLostError):
            for event in list(r.seen):
                await engine.on_host_event(event)
        assert (
            await r.store.head() == head
        )  # the idle candidate it decided never landed: the transaction refused
        assert len(await r.prompts(sid)) == 1


async def test_renewals_and_fenced_writes_of_one_holder_never_race(tmp_path: Path) -> None:
    import anyio

    from loopd_es.engine.fence import FencedStore
    from loopd_es.events.envelope import NewEvent

    async with rig(tmp_path) as r:
        lease = Lease(r.store, "one", r.clock, ttl_ms=60_000)
        assert await lease.try_acquire() is None
        fenced = FencedStore(r.store, lease)

        async def write(i: int) -> None:
            await fenced.append(f"s-{i}", [NewEvent(type="goal.nudged", data={"goal_id": str(i)})])

        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(write, i)
                if i % 4 == 0:
                    tg.start_soon(lease.renew)
        assert sorted([e.stream async for e in r.store.read_all()]) == sorted(f"s-{i}" for i in range(20))
        await lease.check()


async def test_a_multi_stream_write_is_fenced_too_and_refused_after_a_takeover(tmp_path: Path) -> None:
    """A saga step and the goal event it causes go in one ``append_many``; the engine's view of the log must
    fence that as well (it raised NotImplementedError, which stopped the engine at a deferred switch)."""
    from loopd_es.engine.fence import FencedStore
    from loopd_es.events.envelope import NewEvent

    async with rig(tmp_path) as r:
        lease = Lease(r.store, "one", r.clock, ttl_ms=5_000)
        assert await lease.try_acquire() is None
        fenced = FencedStore(r.store, lease)
        step = [
            ("a", [NewEvent(type="goal.nudged", data={"goal_id": "a"})]),
            ("b", [NewEvent(type="goal.nudged", data={"goal_id": "b"})]),
        ]
        first, second = await fenced.append_many(step)
        assert (first[0].stream, second[0].stream) == ("a", "b")
        assert await r.store.head() == 2, "the fence wrote nothing"
        assert await fenced.append_many(step) == [first, second]  # a retry writes nothing
        r.clock.advance(6)
        assert await Lease(r.store, "new", r.clock).try_acquire() is None
        head = await r.store.head()
        with pytest.raises(LeaseLostError):
            await fenced.append_many([("c", [NewEvent(type="goal.nudged", data={"goal_id": "c"})])])
        assert await r.store.head() == head


async def test_an_idle_engine_lease_writes_nothing_to_the_log(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        lease = Lease(r.store, "one", r.clock, ttl_ms=3_000)
        assert await lease.try_acquire() is None
        for _ in range(100):  # five minutes of renewals
            r.clock.advance(1)
            await lease.renew()
            await lease.check()
        await lease.release()
        assert await r.store.head() == 0
        (record,) = await r.store.coord_read()
        assert record.holder == "" and record.token == 1
