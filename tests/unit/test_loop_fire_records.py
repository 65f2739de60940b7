"""Who is firing a /loop slot, and until when, is a coordination record beside the log, never an event (#21).

The log keeps the decision (``loop.slot_claimed``: slot, attempt, due and next due times, who fired it) and the
outcome; the scheduler holds the session's fire record while its host call lasts, renews it, fences every write
of the fire on it and releases it. A scheduler that stalls past its record loses it: another one takes the record
over, records the fire as lost, and the stalled one can land nothing after that.
"""

from __future__ import annotations

import functools
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
import pytest

from loopd_es.clock import from_ms, to_us
from loopd_es.domain.evolve import fold, initial
from loopd_es.domain.loop import decide
from loopd_es.domain.loop.decide import task_id_for
from loopd_es.domain.streams import goal_stream
from loopd_es.errors import StorageError
from loopd_es.events import goal as g
from loopd_es.events import loop as ev
from loopd_es.events.base import CATALOGUE
from loopd_es.events.catalogue import decode_payload, new_event
from loopd_es.log.coord import Claim
from loopd_es.sched import fires
from loopd_es.sched.runner import INTERRUPTED, WAIT_RETRY
from tests.waits import await_until

from ._loop_harness import T0, World, world

if TYPE_CHECKING:
    from loopd_es.sched.runner import Scheduler

pytestmark = pytest.mark.anyio

LEASE_FIELDS = {
    "claimer",
    "claim_expires_at",
    "expires_at",
    "expires_us",
    "lease_expires_at",
    "token",
    "until",
}


def test_no_loop_event_carries_a_lease() -> None:
    """No /loop event names a holder's expiry or fencing token: renewing them as events would be heartbeats."""
    for type_, cls in CATALOGUE.items():
        if type_.startswith("loop."):
            assert not LEASE_FIELDS & set(cls.__struct_fields__), (
                type_,
                LEASE_FIELDS & set(cls.__struct_fields__),
            )


async def _record(w: World, key: str) -> Claim | None:
    return next((r for r in await w.store.coord_read(key) if r.key == key), None)


async def _one_task(w: World, args: str) -> tuple[str, Scheduler, Any]:
    """A task of session ``s1`` (active), a second scheduler, and the host's own ``prompt`` (to wrap)."""
    await w.loop(args, origin_id="t")
    await w.activate("s1")
    return task_id_for("t"), w.scheduler("engine-2"), w.host.prompt


def _runs_to(expires_us: int, record: Claim | None) -> bool:
    return record is not None and record.expires_us == expires_us


async def _raw(w: World, stream: str) -> list[tuple[str, dict[str, Any]]]:
    return [(env.type, msgspec.json.decode(env.data)) async for env in w.store.read_stream(stream)]


async def test_a_fire_holds_its_record_beside_the_log_and_releases_it(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        await w.loop("5m --jitter=false t", origin_id="t")
        tid = task_id_for("t")
        await w.activate("s1")
        key = fires.session_key("s1")
        seen: list[Claim | None] = []
        real_prompt = w.host.prompt

        async def look_then_prompt(*a: Any, **kw: Any) -> Any:
            seen.append(await _record(w, key))
            return await real_prompt(*a, **kw)

        w.host.prompt = look_then_prompt  # type: ignore[method-assign]
        w.now += 300_000
        assert (await w.tick()).fired == [(tid, 1)]
        [during] = seen
        assert during is not None and during.holder == "engine-1" and during.token == 1
        assert fires.in_flight(during) == fires.in_flight(during) is not None
        named = fires.in_flight(during)
        assert named is not None and (named.task_id, named.slot, named.attempt) == (tid, 1, 1)
        assert during.expires_us == to_us(w.at) + w.cfg.claim_ttl_ms * 1000
        after = await _record(w, key)
        assert after == Claim(key=key, holder="", token=1, expires_us=0)  # released, its token kept
        fired = [(t, d) for t, d in await _raw(w, ev.session_stream("s1")) if t == "loop.slot_claimed"]
        assert [d["by"] for _, d in fired] == ["engine-1"]
        assert not LEASE_FIELDS & set(fired[0][1]), fired  # the stored payload holds no lease either
        w.now += 300_000
        assert (await w.tick()).fired == [(tid, 2)]
        again = await _record(w, key)
        assert again is not None and again.token == 2  # each fire takes the record over: a higher token


async def test_runners_take_turns_firing_a_session_without_waiting_to_learn_the_record(
    tmp_path: Path,
) -> None:
    """A runner that never saw a session's record, or saw it with an older token (another runner fired and
    released it since), takes it on its first try: the failed compare-and-set tells it the token. Each fire
    still takes the record over with a higher token."""
    async with world(tmp_path) as w:
        tid, other, _prompt = await _one_task(w, "5m --jitter=false t")
        key = fires.session_key("s1")
        w.now += 300_000
        assert (await w.tick()).fired == [(tid, 1)]
        w.now += 300_000
        assert (await w.tick(other)).fired == [(tid, 2)]  # never saw the record
        w.now += 300_000
        assert (await w.tick()).fired == [(tid, 3)]  # saw it with token 1; it is at 2
        assert await _record(w, key) == Claim(key=key, holder="", token=3, expires_us=0)


async def test_a_long_host_call_renews_its_record_and_is_not_recorded_lost(tmp_path: Path) -> None:
    ttl = 300  # real milliseconds between renewals' deadlines: the renewer runs every 100 ms
    async with world(tmp_path, claim_ttl_ms=ttl) as w:
        tid, other, real_prompt = await _one_task(w, "5m --jitter=false t")
        key = fires.session_key("s1")
        swept: list[int] = []

        async def slow_prompt(*a: Any, **kw: Any) -> Any:
            for _ in range(3):  # 600 ms pass on the scheduler's clock, twice the record's lifetime
                w.now += ttl // 2
                await await_until(
                    "the fire record renewed past the clock",
                    lambda: _record(w, key),
                    done=functools.partial(_runs_to, to_us(w.at) + ttl * 1000),
                )
            report = await other.fire_due()  # another scheduler looks while the call still runs
            swept.append(report.swept)
            return await real_prompt(*a, **kw)

        w.host.prompt = slow_prompt  # type: ignore[method-assign]
        w.now += 300_000
        assert (await w.tick()).fired == [(tid, 1)]
        assert swept == [0]
        events = await w.events()
        assert not [e for e in events if isinstance(e, ev.FireFailed)], events
        assert (await w.task(tid)).fires == 1


async def test_a_stalled_scheduler_is_recorded_lost_and_lands_nothing_after(tmp_path: Path) -> None:
    async with world(tmp_path) as w:  # a 60 s record: no renewal happens while the test moves the clock
        tid, other, real_prompt = await _one_task(w, "30s --jitter=false --once t")
        key = fires.session_key("s1")
        taken_over: list[Claim | None] = []
        calls: list[str] = []

        async def stalled_prompt(*a: Any, **kw: Any) -> Any:
            calls.append(kw["prompt_id"])
            if len(calls) == 1:  # the first fire stalls; the other scheduler's retry goes through
                w.now += w.cfg.claim_ttl_ms + 1  # paused past its record (a suspended laptop, SIGSTOP)
                report = await other.fire_due()
                taken_over.append(await _record(w, key))
                assert (report.swept, report.fired) == (1, [(tid, 1)])  # lost recorded, then the retry fired
            return await real_prompt(*a, **kw)

        w.host.prompt = stalled_prompt  # type: ignore[method-assign]
        report = await w.tick()
        assert (report.fired, report.lost) == ([], 1)
        assert taken_over == [Claim(key=key, holder="", token=3, expires_us=0)]  # taken over twice, released
        events = await w.events()
        outcomes = [e for e in events if isinstance(e, ev.FireSucceeded | ev.FireFailed)]
        assert [(type(e).__name__, e.slot, e.attempt) for e in outcomes] == [
            ("FireFailed", 1, 1),
            ("FireSucceeded", 1, 2),
        ]  # and nothing from the stalled scheduler after them
        assert isinstance(outcomes[0], ev.FireFailed) and outcomes[0].reason == "claimer-lost"
        assert outcomes[0].retry_at == w.at  # a one-shot retries the same slot
        claims = [(e.slot, e.attempt, e.by) for e in events if isinstance(e, ev.SlotClaimed)]
        assert claims == [(1, 1, "engine-1"), (1, 2, "engine-2")]
        assert calls == [f"loop-{tid}-1"] * 2  # the stalled call still reaches the host, as the same slot
        assert not (await w.task(tid)).live  # the one-shot ended with its success


async def test_a_goal_tick_whose_scheduler_died_is_recorded_lost_and_taken_again(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        config = g.GoalConfig(schedule=g.Schedule(every_ms=10_000, max_runs=None))
        created = g.GoalCreated(
            goal_id="g1", name="g1", objective="tick", owner_session_id="s1", config=config
        )
        done = g.GoalCompleted(goal_id="g1", summary="ok", evidence="e", next_run_at=from_ms(T0 + 10_000))
        await w.store.append(goal_stream("g1"), [new_event(created), new_event(done)])
        w.now = T0 + 10_000
        # a scheduler took tick 2 and died before resuming the goal or recording anything else
        dead_records = fires.Records(w.store, fires.GOAL_PREFIX, holder="dead", clock=w.clock, ttl_ms=60_000)
        dead = await dead_records.take("g1", ("goal:g1", 2, 1))
        assert dead is not None
        started = ev.SlotClaimed(
            task_id="goal:g1", slot=2, due_at=w.at, claimed_at=w.at, by="dead", goal_id="g1"
        )
        await w.store.append(ev.goal_slot_stream("g1"), [new_event(started)], fences=[dead.fence])
        assert (await w.tick()).goal_ticks == 0  # its record still holds: nobody else ticks
        w.now += w.cfg.claim_ttl_ms
        assert (await w.tick()).goal_ticks == 1
        slots = [decode_payload(e) async for e in w.store.read_stream(ev.goal_slot_stream("g1"))]
        assert [(type(s).__name__, getattr(s, "slot", 0), getattr(s, "attempt", 0), getattr(s, "reason", None))
                for s in slots] == [  # fmt: skip
            ("SlotClaimed", 2, 1, None), ("FireFailed", 2, 1, "claimer-lost"),
            ("SlotClaimed", 2, 2, None), ("FireSucceeded", 2, 2, None),
        ]  # fmt: skip
        goal = fold([env async for env in w.store.read_stream(goal_stream("g1"))], initial("g1"))
        assert goal.status == "active"
        with pytest.raises(Exception, match="fenced"):  # and the dead scheduler can land nothing
            await w.store.append(goal_stream("g1"), [new_event(done)], fences=[dead.fence])


async def _dead_fire(w: World, tid: str) -> None:
    """A runner took the due slot of ``tid`` (its record, then ``loop.slot_claimed``) and died."""
    s = await w.session()
    dead = fires.Records(w.store, fires.SESSION_PREFIX, holder="dead", clock=w.clock, ttl_ms=60_000)
    c = decide.claim(s, tid, w.at, by="dead", u=0.5)
    assert c is not None
    hold = await dead.take("s1", (tid, c.slot, c.attempt))
    assert hold is not None
    await w.store.append(
        ev.session_stream("s1"), [new_event(e) for e in c.events], s.version, fences=[hold.fence]
    )


async def test_a_record_held_without_naming_a_fire_is_waited_out_without_spinning(tmp_path: Path) -> None:
    """A runner took a session's record to record a lost fire, then died: others wait for the record to run out
    (sleeping until then, not waking at once), then record the lost fire themselves."""
    async with world(tmp_path) as w:
        tid, other, _ = await _one_task(w, "5m --jitter=false t")
        w.now += 300_000
        await _dead_fire(w, tid)
        w.now += 60_001  # the firer's record ran out; a sweeper takes it (naming nothing) and dies as well
        sweeper = fires.Records(w.store, fires.SESSION_PREFIX, holder="sweeper", clock=w.clock, ttl_ms=60_000)
        await sweeper.read("s1")
        assert await sweeper.take("s1") is not None
        for _ in range(3):
            assert (await other.fire_due()).swept == 0
            wake = other.next_wake()
            assert wake is not None and wake > w.at, (wake, w.at)  # asleep until something can change
        w.now += 60_000
        assert (await other.fire_due()).swept == 1
        outcomes = [(e.slot, e.reason) for e in await w.events() if isinstance(e, ev.FireFailed)]
        assert outcomes == [(1, "claimer-lost")]


async def test_the_lost_fire_of_a_task_cancelled_meanwhile_is_recorded_too(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        tid, other, _ = await _one_task(w, "5m --jitter=false --once t")
        await _dead_fire(w, tid)
        await w.loop(f"cancel {tid}")
        w.now += 60_001
        assert (await other.fire_due()).swept == 1
        t = await w.task(tid)
        assert (t.live, t.firing, t.last_outcome) == (False, None, "failed: claimer-lost")
        assert other.next_wake() is None  # nothing left to look at


async def test_a_tick_that_fails_midway_loses_no_due_slot(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        await w.loop("5m --jitter=false t1", session="s1", origin_id="t1")
        await w.loop("5m --jitter=false t2", session="s2", origin_id="t2")
        sched = w.scheduler("B", all_sessions=True)
        w.now += 300_000
        real_swap = w.store.coord_swap
        failures = [StorageError("database is locked (a test's outage)")]

        async def flaky_swap(*a: Any, **kw: Any) -> Any:
            if failures:
                raise failures.pop()
            return await real_swap(*a, **kw)

        w.store.coord_swap = flaky_swap  # type: ignore[method-assign]
        with pytest.raises(StorageError):
            await sched.fire_due()
        assert sched.next_wake() == w.at + WAIT_RETRY  # looked at again after a pause, not in a tight loop
        w.now += 1_000
        assert (await sched.fire_due()).fired == [(task_id_for("t1"), 1), (task_id_for("t2"), 1)]


async def test_a_record_runs_from_when_it_is_taken_not_from_the_tick_start(tmp_path: Path) -> None:
    """A tick fires sessions one after another; a slow first delivery must not leave the second session's record
    born run out (another runner would record a live fire lost and inject into the same session)."""
    async with world(tmp_path, claim_ttl_ms=5_000) as w:
        await w.loop("5m --jitter=false --once t1", session="s1", origin_id="t1")
        await w.loop("5m --jitter=false --once t2", session="s2", origin_id="t2")
        first, second = w.scheduler("A", all_sessions=True), w.scheduler("B", all_sessions=True)
        w.now += 300_000
        real_prompt = w.host.prompt
        calls: list[str] = []
        looked: list[int] = []

        async def slow_prompt(sid: str, *a: Any, **kw: Any) -> Any:
            calls.append(sid)
            if len(calls) == 1:
                w.now += 6_000  # a slow delivery, longer than the record's 5 s (renewed meanwhile)
            elif len(calls) == 2:
                w.now += 10
                looked.append((await second.fire_due()).swept)
            return await real_prompt(sid, *a, **kw)

        w.host.prompt = slow_prompt  # type: ignore[method-assign,assignment]
        report = await first.fire_due()
        assert (sorted(report.fired), report.lost, looked, calls) == (
            [(task_id_for("t1"), 1), (task_id_for("t2"), 1)], 0, [0], ["s1", "s2"]
        )  # fmt: skip


async def test_a_slot_waiting_for_its_session_keeps_one_entry_however_long_it_waits(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        await w.loop("5m --jitter=false t", origin_id="t")
        await w.activate(
            "s2"
        )  # the user is elsewhere: the task waits (it does not fire into another session)
        w.now += 300_000
        for _ in range(100):
            assert (await w.tick()).waiting == 1
            w.now += 1_000
        assert len(w.sched.due) <= 2 and w.sched.due._deferred == {
            "s1": {task_id_for("t"): w.at - timedelta(seconds=100)}
        }
        await w.activate("s1")
        assert (await w.tick()).fired == [(task_id_for("t"), 1)]


async def test_a_runner_that_adopts_nothing_sleeps_while_a_dead_owners_fire_record_holds(
    tmp_path: Path,
) -> None:
    """A durable task's owner died mid-fire: its record still holds for a while, its lease has run out. A runner
    without ``--owner`` (it adopts nothing) has nothing to do until the record runs out, and sleeps until then."""
    async with world(tmp_path) as w:
        await w.loop("5m --jitter=false t", origin_id="t", owner="gone", durable=True)
        await w.activate("s1")
        tid = task_id_for("t")
        w.now += 300_000
        await _dead_fire(w, tid)
        runner = w.scheduler("plain")  # no owner: it adopts nothing
        for _ in range(3):
            w.now += 1_000
            assert (await runner.fire_due()).swept == 0
            wake = runner.next_wake()
            assert wake is not None and wake > w.at, (wake, w.at)
        w.now += 60_000
        assert (await runner.fire_due()).swept == 1  # the lost fire, once the record ran out


async def test_a_delivered_fire_whose_record_ran_out_unclaimed_is_recorded_as_delivered(
    tmp_path: Path,
) -> None:
    """The runner's clock passed the record's end during the host call, and nobody took the record over: the
    renewal extends it, and the outcome is recorded (the fence, not the clock, says who lost)."""
    ttl = 300
    async with world(tmp_path, claim_ttl_ms=ttl) as w:
        tid, _, real_prompt = await _one_task(w, "5m --jitter=false --once t")
        key = fires.session_key("s1")

        async def late_prompt(*a: Any, **kw: Any) -> Any:
            w.now += ttl + 100  # past the record's end before the first renewal
            await await_until(
                "the record renewed past the clock",
                lambda: _record(w, key),
                done=lambda r: r is not None and r.expires_us > to_us(w.at),
            )
            return await real_prompt(*a, **kw)

        w.host.prompt = late_prompt  # type: ignore[method-assign]
        report = await w.tick()
        assert (report.fired, report.lost) == ([(tid, 1)], 0)
        assert not [e for e in await w.events() if isinstance(e, ev.FireFailed)]


async def test_a_fire_cancelled_during_its_host_call_is_recorded_interrupted_and_its_record_freed(
    tmp_path: Path,
) -> None:
    async with world(tmp_path) as w:
        tid, _, _ = await _one_task(w, "30s --jitter=false --once t")
        calling = anyio.Event()

        async def hanging_prompt(*a: Any, **kw: Any) -> Any:
            calling.set()
            await anyio.sleep_forever()

        w.host.prompt = hanging_prompt  # type: ignore[method-assign]
        async with anyio.create_task_group() as tg:
            tg.start_soon(w.tick)
            await calling.wait()
            tg.cancel_scope.cancel()  # the engine's bound on a tick, or its stop
        outcomes = [(e.slot, e.reason, e.retry_at) for e in await w.events() if isinstance(e, ev.FireFailed)]
        assert outcomes == [
            (1, INTERRUPTED, w.at + timedelta(seconds=30))
        ]  # a one-shot retries a period later
        record = await _record(w, fires.session_key("s1"))
        assert record is not None and not record.holder  # released: nobody waits for it to run out
        assert (await w.task(tid)).firing is None


def test_an_event_of_one_session_undefers_only_that_sessions_waiting_slots() -> None:
    from loopd_es.domain.loop.due import DueIndex

    index, due, later = DueIndex(), from_ms(T0), from_ms(T0 + 1_000)
    index.defer(due, "a", "t1", later)
    index.defer(due, "b", "t2", later)
    assert index.pop_due(due, lambda _s, _k: due) == []  # both wait until `later`
    index.undefer("a")
    assert index.pop_due(due, lambda _s, _k: due) == [(due, "a", "t1")]
    index.undefer()  # e.g. another session became the active one
    assert index.pop_due(due, lambda _s, _k: due) == [(due, "b", "t2")]
    moved = from_ms(T0 + 5_000)  # both fired: their copies deferred to `later` are stale and dropped
    assert index.pop_due(later, lambda _s, _k: moved) == [] and index.next_at() is None
