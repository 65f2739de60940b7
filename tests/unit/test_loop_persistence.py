"""Multi-instance scenarios 30-38 of docs/reference/loop-plugin.md#s6, where the log makes the reference's
races impossible.

The reference merges whole records with last-writer-wins; here every change is its own event appended at the
version its decision was made on, so a stale writer loses the race, re-reads and decides again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from loopd_es.clock import from_ms
from loopd_es.domain.loop import decide
from loopd_es.domain.loop.decide import task_id_for
from loopd_es.domain.loop.model import TTL_MS
from loopd_es.errors import WrongExpectedVersionError
from loopd_es.events import loop as ev
from loopd_es.events.catalogue import new_event
from loopd_es.sched import service

from ._loop_harness import T0, ms, world

pytestmark = pytest.mark.anyio


async def test_scenario_30_two_instances_create_concurrently(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        async with anyio.create_task_group() as tg:
            for i in range(6):
                tg.start_soon(_create, w, f"5m task {i}", f"m{i}")
        assert len((await w.session()).live()) == 6


async def _create(w: Any, args: str, origin: str) -> None:
    await w.loop(args, origin_id=origin)


async def test_scenario_11_two_instances_same_message_one_task(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(_create, w, "1m ping", "same-message")
        assert [t.task_id for t in (await w.session()).live()] == [task_id_for("same-message")]


async def test_scenario_31_cancelled_is_never_resurrected(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        await w.loop("1s t", origin_id="t")
        tid = task_id_for("t")
        stale = await w.session()
        await w.loop(f"cancel {tid}")
        # a stale peer tries to write on its old view: the append is refused, and a re-decision sees no task
        paused = decide.manage(stale, "pause", tid, now=w.at, u=0.5, cfg=w.cfg)
        with pytest.raises(WrongExpectedVersionError):
            await w.store.append(
                ev.session_stream("s1"), [new_event(e) for e in paused.events], stale.version
            )
        assert (await w.loop(f"resume {tid}")).message == f"❌ No task {tid} in this session"
        await w.activate("s1")
        w.now += 10_000
        assert (await w.tick()).fired == []
        assert not (await w.task(tid)).live


async def test_scenario_32_33_peer_changes_are_seen(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        await w.loop("5m t", origin_id="t")
        await w.loop("5m p", origin_id="p")
        t, p = task_id_for("t"), task_id_for("p")
        await w.loop(f"cancel {t}")  # "peer B"
        await w.loop(f"pause {p}")
        await w.loop("5m u", origin_id="u")  # "instance A" writes something unrelated
        s = await w.session()
        assert [x.task_id for x in s.live()] == [p, task_id_for("u")]
        assert s.tasks[p].paused
        await w.loop(f"resume {p}")
        assert not (await w.task(p)).paused


async def test_scenario_34_a_fire_never_erases_a_pause(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        await w.loop("1s --jitter=false t", origin_id="t")
        tid = task_id_for("t")
        await w.activate("s1")
        w.now += 1_000
        stale = await w.session()
        await w.loop(f"pause {tid}")
        c = decide.claim(stale, tid, w.at, by="A", u=0.5)
        assert c is not None
        with pytest.raises(WrongExpectedVersionError):
            await w.store.append(ev.session_stream("s1"), [new_event(e) for e in c.events], stale.version)
        assert (await w.tick()).fired == []
        assert (await w.task(tid)).paused


async def test_scenario_34_pause_during_the_fire_survives_its_record(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        await w.loop("1s --jitter=false t", origin_id="t")
        tid = task_id_for("t")
        await w.activate("s1")
        real_prompt = w.host.prompt

        async def prompt_then_pause(*a: Any, **kw: Any) -> Any:
            receipt = await real_prompt(*a, **kw)
            await w.loop(f"pause {tid}")  # the user pauses while the fire is in flight
            return receipt

        w.host.prompt = prompt_then_pause  # type: ignore[method-assign]
        w.now += 1_000
        assert (await w.tick()).fired == [(tid, 1)]
        t = await w.task(tid)
        assert t.paused and t.fires == 1


async def test_scenario_35_ephemeral_tasks_die_with_their_owners_lease(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        await service.renew_lease(w.store, "proc-a", w.at, 15_000)
        await service.renew_lease(w.store, "proc-b", w.at, 15_000)
        await w.loop("5m a", origin_id="a", owner="proc-a", durable=False)
        await w.loop("5m b", origin_id="b", owner="proc-b", durable=False)
        await w.loop("5m c", origin_id="c")  # ownerless: lives until idle for 7 days
        w.now += 10_000
        await service.renew_lease(w.store, "proc-a", w.at, 15_000)
        w.now += 10_000  # b's lease expired 5 s ago, a's has 5 s left
        r = await w.tick()
        assert r.swept == 1
        assert (await w.task(task_id_for("b"))).cancelled == "owner-dead"
        assert (await w.task(task_id_for("a"))).live and (await w.task(task_id_for("c"))).live


async def test_scenario_35_idle_expiry_after_seven_days(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        await w.loop("10d idle", origin_id="idle")
        await w.loop("1d --jitter=false busy", origin_id="busy")
        await w.activate("s1")
        for _ in range(8):
            w.now += 86_400_000
            await w.tick()
        assert (await w.task(task_id_for("idle"))).cancelled == "expired"
        busy = await w.task(task_id_for("busy"))
        assert busy.live and busy.fires == 8 and ms(busy.created_at) + TTL_MS < w.now


async def test_scenario_36_37_durable_tasks_are_adopted_and_fire_after_restart(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        await service.renew_lease(w.store, "old", w.at, 15_000)
        await w.loop("1s --jitter=false d", origin_id="d", owner="old", durable=True)
        tid = task_id_for("d")
        await w.activate("s1")
        w.now += 60_000  # "old" died long ago; a new engine starts
        fresh = w.scheduler("engine-2", owner="new")
        r = await fresh.fire_due()
        assert r.fired == [(tid, 60)] and r.missed == 59
        t = await w.task(tid)
        assert t.owner == "new"
        adopted = [e for e in await w.events() if isinstance(e, ev.TaskAdopted)]
        assert [(a.previous_owner, a.owner) for a in adopted] == [("old", "new")]


async def test_scenario_38_two_schedulers_one_fire_per_slot(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        for i in range(5):
            await w.loop(f"1s --jitter=false t{i}", origin_id=f"t{i}")
        await w.activate("s1")
        scheds = [w.scheduler(f"engine-{i}", all_sessions=True) for i in range(4)]
        for _ in range(10):
            w.now += 1_000
            async with anyio.create_task_group() as tg:
                for s in scheds:
                    tg.start_soon(s.fire_due)
        events = await w.events()
        claims = [(e.task_id, e.slot) for e in events if isinstance(e, ev.SlotClaimed)]
        done = [(e.task_id, e.slot) for e in events if isinstance(e, ev.FireSucceeded)]
        assert len(claims) == len(set(claims)) and sorted(claims) == sorted(done)
        assert len(await w.prompts()) == len(done)
        missed = sum(e.n for e in events if isinstance(e, ev.SlotsMissed))
        assert len(done) + missed == 50


async def test_the_task_cap_holds_under_concurrent_creations_in_different_sessions(tmp_path: Path) -> None:
    from loopd_es.sched.tools import loop_schedule

    async with world(tmp_path, max_tasks=3, sessions=tuple(f"s{i}" for i in range(8))) as w:
        await w.loop("5m a", session="s0", origin_id="a")
        await w.loop("5m b", session="s1", origin_id="b")
        results: list[str | None] = []

        async def slash(i: int) -> None:
            results.append((await w.loop(f"5m t{i}", session=f"s{i}", origin_id=f"c{i}")).error)

        async def tool(i: int) -> None:
            try:
                await loop_schedule(w.store, {"action": "create", "prompt": "p", "intervalMs": 60_000},
                                    session_id=f"s{i}", now=from_ms(T0), cfg=w.cfg, origin_id=f"d{i}")  # fmt: skip
                results.append(None)
            except Exception:  # the reference's tool throws "Max tasks"
                results.append("conflict")

        async with anyio.create_task_group() as tg:
            for i in range(2, 8):
                tg.start_soon(slash if i % 2 else tool, i)
        live = sum([len((await w.session(f"s{i}")).live()) for i in range(8)])
        assert live == 3 and results.count(None) == 1


async def test_multi_stream_appends_of_loops_land_whole_on_ndjson(tmp_path: Path) -> None:
    # A session deletion (cancellations + the deletion fact) is one append_many; on NDJSON a one-event first
    # part once hid every later part. A creation is one append, fenced on the cap's coordination record.
    from loopd_es.domain.loop import decide as d
    from loopd_es.log import open_store

    async with await open_store(f"ndjson:{tmp_path / 'ev.ndjson'}") as store:
        out = await service.handle(store, "5m ping", session_id="s1", now=from_ms(0), cfg=d.Config(), origin_id="m",
                                   directory=tmp_path, home=tmp_path)  # fmt: skip
        assert out.error is None
        assert await store.stream_version(ev.CAP_STREAM) == 0  # the cap is held beside the log, not as events
        (cap,) = await store.coord_read(service.CAP_KEY)
        assert (cap.holder, cap.token) == ("", 1)  # taken once, given back
        assert await service.delete_session(store, "s1", from_ms(1)) == 1
        types = [env.type async for env in store.read_stream(ev.ACTIVE_STREAM)]
        assert types == ["loop.session_activated", "loop.session_deleted"]


async def test_a_command_that_keeps_losing_races_says_so(tmp_path: Path) -> None:
    from loopd_es.errors import ConflictError

    async with world(tmp_path) as w:
        await w.loop("5m ping", origin_id="p")

        async def always_moved(stream: str, events: object, expected_version: object = None) -> object:
            raise WrongExpectedVersionError(stream, 1, 2)

        w.store.append = always_moved  # type: ignore[method-assign,assignment]
        with pytest.raises(ConflictError, match="kept changing during 20 attempts; run the command again"):
            await w.loop(f"pause {task_id_for('p')}")


async def test_the_task_cap_holds_across_connections_as_across_processes(tmp_path: Path) -> None:
    # two processes on one log count the live tasks each on its own connection: the cap's hold is beside the log
    from loopd_es.domain.loop import decide as d
    from loopd_es.log import open_store

    url = f"sqlite:{tmp_path / 'log.db'}"
    cfg = d.Config(max_tasks=1)
    async with await open_store(url) as first, await open_store(url) as second:
        errors: list[str | None] = []

        async def create(store: Any, session: str) -> None:
            out = await service.handle(store, "5m ping", session_id=session, now=from_ms(0), cfg=cfg,
                                       origin_id=f"m-{session}", directory=tmp_path, home=tmp_path)  # fmt: skip
            errors.append(out.error)

        async with anyio.create_task_group() as tg:
            tg.start_soon(create, first, "s1")
            tg.start_soon(create, second, "s2")
        live = [len((await service.read_session(first, s)).live()) for s in ("s1", "s2")]
        assert sum(live) == 1 and sorted(errors, key=str) == sorted([None, "conflict"], key=str), (
            live,
            errors,
        )
