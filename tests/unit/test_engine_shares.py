"""Shared engines (``loopd-es run --shared``): members, per-goal claims, the goal fence and the balance pass.

A goal is claimed by one member at a time, taken over only once its holder's membership ran out; a holder that
lost a goal neither writes about it nor prompts for it, even when it checked a moment before; rendezvous
hashing moves few goals when members come and go; the balance pass spreads goals and adopts a dead member's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from loopd_es.domain.streams import goal_stream
from loopd_es.engine.balance import Balancer
from loopd_es.engine.core import Engine, EngineConfig
from loopd_es.engine.goal_fence import GoalFencedStore, UnfencedWriteError, unfenced_goals
from loopd_es.engine.shares import CLAIM_PREFIX, GoalLostError, Shares, claim_key, preferred
from loopd_es.events import goal as g
from loopd_es.events import notification as n
from loopd_es.events.catalogue import new_event
from loopd_es.host.errors import NotASessionError
from loopd_es.log.base import StreamWrite
from loopd_es.log.coord import Fence

from ._engine_harness import Rig, rig

pytestmark = pytest.mark.anyio


async def _observe_all(store: object, *shares: Shares) -> None:
    for s in shares:
        await s.refresh()


async def _holding(r: Rig, gid: str, name: str, ttl_ms: int) -> tuple[Shares, Engine]:
    """A started shared engine, member ``name``, holding goal ``gid``."""
    member = Shares(r.store, name, r.clock, ttl_ms=ttl_ms)
    await member.join()
    assert await member.claim(gid, "preferred")
    engine = Engine(
        GoalFencedStore(r.store, member), r.host, r.clock, EngineConfig(confirm_idle_ms=0), shares=member
    )
    await engine.start()
    return member, engine


async def test_one_holder_per_goal_takeover_only_after_the_holder_is_no_live_member(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        a = Shares(r.store, "a", r.clock, ttl_ms=10_000)
        b = Shares(r.store, "b", r.clock, ttl_ms=10_000)
        await a.join()
        await b.join()
        await _observe_all(r.store, a, b)
        assert await a.claim("g1", "preferred")
        assert not await b.claim("g1", "preferred"), "a live holder's goal is never taken"
        r.clock.advance(6)
        await a.renew()
        await _observe_all(r.store, b)
        r.clock.advance(6)
        await b.renew()
        assert not await b.claim("g1", "stranded"), "renewed at 6 s, the holder is live until 16 s"
        r.clock.advance(5)
        assert await b.claim("g1", "stranded")
        assert b.owns("g1")
        with pytest.raises(GoalLostError):
            await a.check("g1")
        assert not a.owns("g1")
        assert not await a.claim("g2", "preferred"), "a member whose membership ran out claims nothing"
        await b.release("g1", "finished")
        await a.renew()
        assert await a.claim("g1", "preferred"), "a released goal is free at once"


async def test_claims_race_and_exactly_one_contender_wins(tmp_path: Path) -> None:
    import anyio

    async with rig(tmp_path) as r:
        members = [Shares(r.store, f"m{i}", r.clock, ttl_ms=10_000) for i in range(5)]
        for m in members:
            await m.join()
        won: list[str] = []

        async def contend(m: Shares) -> None:
            if await m.claim("g", "preferred"):
                won.append(m.member)

        async with anyio.create_task_group() as tg:
            for m in members:
                tg.start_soon(contend, m)
        assert len(won) == 1
        (record,) = await r.store.coord_read(CLAIM_PREFIX)
        assert record.key == claim_key("g") and record.holder == won[0] and record.token == 1
        assert await r.store.head() == 0, "a first claim is no history"


async def test_a_member_that_lost_a_goal_writes_nothing_about_it_even_after_checking(tmp_path: Path) -> None:
    async with rig(tmp_path, config=EngineConfig(confirm_idle_ms=0)) as r:
        gid, sid = await r.started()
        old, engine = await _holding(r, gid, "old", 5_000)
        await r.host.reply(sid)
        before = await r.store.head()
        await engine.on_host_event(r.seen.pop(0))  # the answer: accounted, fenced with the old claim
        assert await r.store.head() > before
        assert not [e async for e in r.store.read_all(types=["engine.goal_fenced"])], "a fence writes nothing"
        r.clock.advance(6)  # the old member stalled past its membership; another takes the goal over
        new = Shares(r.store, "new", r.clock, ttl_ms=5_000)
        await new.join()
        await _observe_all(r.store, new)
        assert await new.claim(gid, "stranded")
        old.expires_at = r.clock.now() + old.ttl  # paused, it still believes itself live
        head = await r.store.head()
        with pytest.raises(
            GoalLostError
        ):  # every check passed just before; the write lands after the takeover
            await engine.on_idle(gid)
        handled = [await engine.on_host_event(event) for event in list(r.seen)]
        assert not any(handled), "a goal it lost is not its to act on"
        assert await r.store.head() == head, "nothing it decided landed"
        assert len(await r.prompts(sid)) == 1


async def test_a_goal_write_carries_its_fence_explicitly_and_an_unfenced_one_is_refused(
    tmp_path: Path,
) -> None:
    """The fence is an argument of the write: a shared engine's write to a goal's stream without that goal's
    claim fails loudly before it reaches the log, whatever the engine was doing when it wrote."""
    async with rig(tmp_path) as r:
        gid, _ = await r.started()
        member = Shares(r.store, "m", r.clock, ttl_ms=10_000)
        await member.join()
        assert await member.claim(gid, "preferred")
        view = GoalFencedStore(r.store, member)
        nudge = [new_event(g.GoalNudged(goal_id=gid))]
        head = await r.store.head()
        with pytest.raises(UnfencedWriteError, match=f"carries no fence for goal {gid}"):
            await view.append(goal_stream(gid), nudge)
        with pytest.raises(UnfencedWriteError):  # another goal's fence does not do
            await view.append(goal_stream(gid), nudge, fences=[Fence(claim_key("other"), 1)])
        assert await r.store.head() == head, "nothing written"
        assert unfenced_goals([StreamWrite(goal_stream(gid), nudge)], member.fence_for(gid)) == []
        (landed,) = await view.append(goal_stream(gid), nudge, fences=member.fence_for(gid))
        assert landed.type == "goal.nudged"
        notice = new_event(n.NotificationDelivered(notification_id="x:k", goal_id="", at=None))
        await view.append("notifications", [notice])  # about no goal: nothing to fence
        with pytest.raises(GoalLostError, match="does not hold it"):
            member.fence_for("never-claimed")
        stale = [Fence(claim_key(gid), member.held[gid] + 1)]  # a token someone else's claim moved to
        with pytest.raises(GoalLostError, match="claimed by another engine"):
            await view.append(goal_stream(gid), nudge, fences=stale)
        assert gid not in member.held


async def test_an_engine_of_a_shared_group_fences_every_goal_write_it_makes(tmp_path: Path) -> None:
    """Through the engine, every write about a goal names the goal's claim: the whole turn cycle runs on a view
    that refuses any unfenced goal write."""
    async with rig(tmp_path, config=EngineConfig(confirm_idle_ms=0)) as r:
        gid, sid = await r.started()
        _, engine = await _holding(r, gid, "m", 60_000)
        runs = (await r.state(gid)).run_count
        await r.host.reply(sid)
        for event in list(r.seen):
            await engine.on_host_event(event)
        await engine.catch_up()
        assert (await r.state(gid)).run_count == runs + 1, "confirmed and continued, every write fenced"


def test_rendezvous_moves_about_one_nth_of_the_goals_when_a_member_joins() -> None:
    goals = [f"goal-{i}" for i in range(3000)]
    three = {g: preferred(g, ["a", "b", "c"]) for g in goals}
    four = {g: preferred(g, ["a", "b", "c", "d"]) for g in goals}
    moved = [g for g in goals if three[g] != four[g]]
    assert all(four[g] == "d" for g in moved), "only goals going to the new member move"
    assert 0.18 < len(moved) / len(goals) < 0.32  # about a quarter
    spread = {m: sum(1 for g in goals if three[g] == m) for m in "abc"}
    assert min(spread.values()) > 850, spread
    assert preferred("g", []) is None


async def test_the_balance_pass_spreads_goals_and_adopts_a_dead_members_share(tmp_path: Path) -> None:
    async with rig(tmp_path, config=EngineConfig(confirm_idle_ms=0)) as r:
        goal_ids = [(await r.started(f"g{i}", workspace_write=False))[0] for i in range(12)]
        engines = []
        for name in ("a", "b"):
            shares = Shares(r.store, name, r.clock, ttl_ms=3_000)
            await shares.join()
            engine = Engine(GoalFencedStore(r.store, shares), r.host, r.clock, r.engine.config, shares=shares)
            await engine.start()
            engines.append((engine, shares, Balancer(engine, shares, r.clock)))
        for engine, _, balancer in engines:
            await engine.catch_up()
            await balancer.run()
        for engine, _, balancer in engines:
            await engine.catch_up()
            await balancer.run()
        held = {s.member: set(s.held) for _, s, _ in engines}
        a, b = engines[0][1], engines[1][1]
        assert held[a.member] and held[b.member], held
        assert held[a.member] | held[b.member] == set(goal_ids) and not held[a.member] & held[b.member]
        # a dies (no renewal); after its membership ran out, b's pass claims a's goals and adopts them
        r.clock.advance(4)
        await b.renew()
        engine_b, _, balancer_b = engines[1]
        await engine_b.catch_up()
        await balancer_b.run()
        assert set(b.held) == set(goal_ids)
        assert balancer_b.adopted == len(goal_ids)
        takeovers = [
            e.data_dict()
            async for e in r.store.read_all(types=["engine.goal_moved"])
            if e.data_dict()["member"] == b.member and e.data_dict()["previous_member"] == a.member
        ]
        assert len(takeovers) == len(held[a.member])
        assert {t["reason"] for t in takeovers} == {"takeover"}
        moved = [e async for e in r.store.read_all(types=["engine.goal_moved"])]
        assert len(moved) == len(takeovers), "first claims are no history; only moves are"


async def test_a_goal_whose_first_turn_ended_before_any_member_claimed_it_is_confirmed_at_its_claim(
    tmp_path: Path,
) -> None:
    """``goal create`` sends the first prompt itself; a worker that answers at once goes idle before a member
    of the group claimed the goal, and a member acts only on the events of goals it holds. The claiming member
    takes the idle worker as the turn's first idle signal: the turn is confirmed one quiet period later, not
    at the next maintenance pass (it waited up to 30 s)."""
    async with rig(tmp_path, config=EngineConfig(confirm_idle_ms=100)) as r:
        member = Shares(r.store, "m", r.clock, ttl_ms=3_000)
        await member.join()
        engine = Engine(GoalFencedStore(r.store, member), r.host, r.clock, r.engine.config, shares=member)
        await engine.start()
        engine.next_maintenance = None  # no maintenance pass: what it would have done must not be needed
        gid, sid = await r.started("first", workspace_write=False, max_turns=3)
        await r.host.reply(sid)
        for event in r.seen:  # the idle goes by while nobody holds the goal: the member ignores it
            assert not await engine.on_host_event(event)
        r.seen.clear()
        await engine.catch_up()
        await Balancer(engine, member, r.clock).run()
        assert gid in member.held
        r.clock.advance(0.2)
        await engine.run_due()
        await engine.catch_up()
        types = await r.types(gid)
        assert types.count("run.completed") == 1 and types.count("run.started") == 2, types
        assert len(await r.prompts(sid)) == 2
        r.engine = engine


async def test_a_finished_goal_whose_notice_has_no_session_is_given_up_and_never_moved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A goal created from the CLI is owned by ``cli``, which is no OpenCode session: its notice is recorded
    undeliverable, so the finished goal has nothing pending and its holder gives it up. It used to stay
    pending for ever: every member kept its finished goals, and every stop moved each of them to another
    member (``engine.goal_moved`` per finished goal) - a move is history only for a goal that still turns."""

    async def no_session(session_id: str, text: str, *, notification_id: str) -> bool:
        raise NotASessionError("notify", session_id=session_id)

    async with rig(tmp_path, config=EngineConfig(confirm_idle_ms=0)) as r:
        monkeypatch.setattr(r.host, "notify", no_session)
        gid, sid = await r.started("done", workspace_write=False)
        a = Shares(r.store, "a", r.clock, ttl_ms=3_000)
        await a.join()
        engine_a = Engine(GoalFencedStore(r.store, a), r.host, r.clock, r.engine.config, shares=a)
        await engine_a.start()
        balancer_a = Balancer(engine_a, a, r.clock)
        await engine_a.catch_up()
        await balancer_a.run()
        assert gid in a.held
        assert (await r.ops.complete(sid, "all done", "it works")).status != "error"
        await engine_a.catch_up()  # the completion's notice: recorded, and settled as undeliverable
        await balancer_a.run()
        assert gid not in a.held, "a finished goal with nothing left to deliver is given up"
        types = [e.type async for e in r.store.read_stream(n.STREAM)]
        assert types == ["notification.requested", "notification.undeliverable"], types
        b = Shares(r.store, "b", r.clock, ttl_ms=3_000)
        await b.join()
        engine_b = Engine(GoalFencedStore(r.store, b), r.host, r.clock, r.engine.config, shares=b)
        await engine_b.start()
        await a.leave()
        await engine_b.catch_up()
        await Balancer(engine_b, b, r.clock).run()
        assert gid not in b.held
        assert [e async for e in r.store.read_all(types=["engine.goal_moved"])] == []
        r.engine = engine_a
