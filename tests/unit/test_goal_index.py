"""The in-memory goal index the tool channel answers from: the same states as folding each goal's stream,
found by owner and by worker session, caught up incrementally, and reading only what was appended since."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopd_es.app.goal_index import GoalIndex
from loopd_es.domain.evolve import fold, initial
from loopd_es.domain.streams import goal_stream
from loopd_es.engine.operations import Operations

from ._engine_harness import rig

pytestmark = pytest.mark.anyio


async def test_the_index_holds_what_folding_each_stream_gives_and_finds_sessions(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        index = GoalIndex(r.store)
        owners = {}
        for i in range(6):
            ops = Operations(r.store, r.host, clock=r.clock, owner=f"owner-{i % 2}")
            created = await ops.create(f"g{i}", "o", workspace_write=False)
            assert created.goal_id is not None
            owners[created.goal_id] = f"owner-{i % 2}"
        await index.catch_up()
        for goal_id in owners:
            folded = fold([e async for e in r.store.read_stream(goal_stream(goal_id))], initial(goal_id))
            assert index.states[goal_id] == folded
        assert {g.goal_id for g in index.of_owner("owner-0")} == {
            g for g, o in owners.items() if o == "owner-0"
        }
        some = next(iter(owners))
        worker = index.states[some].worker_session_id
        assert worker is not None and [g.goal_id for g in index.of_worker(worker)] == [some]
        assert index.of_owner("nobody") == [] and index.of_worker("nobody") == []
        # appended since: caught up by reading only the new events
        ops = Operations(r.store, r.host, clock=r.clock, owner=owners[some])
        await ops.clear(some)
        position = index.position
        await index.catch_up()
        assert index.position > position
        assert some not in {g.goal_id for g in index.of_owner(owners[some])}, "a cleared goal is gone"
        assert some not in {g.goal_id for g in index.existing()}
        head = await r.store.head()
        await index.catch_up()  # nothing new: nothing read
        assert index.position == head


async def test_operations_with_an_index_read_no_other_goals_stream(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        for i in range(5):
            await Operations(r.store, r.host, clock=r.clock, owner="other").create(
                f"g{i}", "o", workspace_write=False
            )
        mine = await Operations(r.store, r.host, clock=r.clock, owner="me").create(
            "mine", "o", workspace_write=False
        )
        index = GoalIndex(r.store)
        await index.catch_up()
        reads: list[str | None] = []
        inner = r.store.read_batches

        def counting(**kw):  # type: ignore[no-untyped-def]
            reads.append(kw.get("stream"))
            return inner(**kw)

        r.store.read_batches = counting  # type: ignore[method-assign]
        ops = Operations(r.store, r.host, clock=r.clock, owner="me", index=index)
        found = await ops.service.goals_of_owner("me")
        assert [g.goal_id for g in found] == [mine.goal_id]
        assert not [s for s in reads if s is not None], f"goal streams folded again: {reads}"


async def test_concurrent_callers_share_one_read_and_each_sees_what_was_there_when_it_asked(
    tmp_path: Path,
) -> None:
    import anyio

    async with rig(tmp_path) as r:
        await Operations(r.store, r.host, clock=r.clock, owner="me").create("g", "o", workspace_write=False)
        index = GoalIndex(r.store)
        heads = 0
        inner = r.store.head

        async def counting() -> int:
            nonlocal heads
            heads += 1
            return await inner()

        r.store.head = counting  # type: ignore[method-assign]
        seen: list[int] = []

        async def ask() -> None:
            await index.catch_up()
            seen.append(len(index.of_owner("me")))

        async with anyio.create_task_group() as tg:
            for _ in range(50):
                tg.start_soon(ask)
        assert seen == [1] * 50, "every caller saw the goal created before it asked"
        assert heads <= 2, f"{heads} reads for 50 concurrent callers"


async def test_a_goal_first_loaded_through_the_index_reads_only_what_came_after_it(tmp_path: Path) -> None:
    """A tool call's service starts a goal from the index's state and reads only the events appended since,
    and the state it gets is the whole stream's fold."""
    async with rig(tmp_path) as r:
        created = await Operations(r.store, r.host, clock=r.clock, owner="me").create(
            "g", "o", workspace_write=False
        )
        goal_id = created.goal_id
        assert goal_id is not None
        index = GoalIndex(r.store)
        await index.catch_up()
        indexed = index.states[goal_id].version
        await Operations(r.store, r.host, clock=r.clock, owner="me").pause(goal_id)  # after the catch-up
        froms: list[int] = []
        inner = r.store.read_batches

        def counting(**kw):  # type: ignore[no-untyped-def]
            froms.append(kw.get("from_version", 1))
            return inner(**kw)

        r.store.read_batches = counting  # type: ignore[method-assign]
        state = await Operations(r.store, r.host, clock=r.clock, owner="me", index=index).service.load(
            goal_id
        )
        r.store.read_batches = inner  # type: ignore[method-assign]
        folded = fold([e async for e in r.store.read_stream(goal_stream(goal_id))], initial(goal_id))
        assert state == folded and state.status == "paused"
        assert froms == [indexed + 1], f"read from versions {froms}, the index had {indexed}"
