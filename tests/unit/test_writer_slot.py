"""The single-writer rule across processes: two activations that both saw the slot free cannot both land.

Each process decided on the goals it read; a writer created by another process (another machine: its own
host) between that read and the append landed too, and two workspace-writing goals ran at once. A writer is
now decided again holding the ``goals/writer-slot`` coordination record (beside the log, no event) and
appended fenced on it. The race is made deterministic here: the second writer lands while the first one's
decision is being made.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from loopd_es.app.service import Ctx, GoalService
from loopd_es.app.writer_slot import KEY
from loopd_es.domain import goal_commands as c
from loopd_es.domain.rules import RuleError
from loopd_es.host import SimulatedHost
from loopd_es.host.sim_script import HostScript
from loopd_es.log import open_store

pytestmark = pytest.mark.anyio


def _create(goal_id: str) -> c.CreateGoal:
    return c.CreateGoal(goal_id=goal_id, name=goal_id, objective="o", owner_session_id="owner")


async def test_a_writer_landing_during_another_writers_decision_makes_it_decide_again(tmp_path: Path) -> None:
    async with await open_store(f"sqlite:{tmp_path / 'log.db'}") as store:
        first = GoalService(store, SimulatedHost(HostScript()))
        second = GoalService(
            store, SimulatedHost(HostScript())
        )  # another machine: nothing shared but the log
        real_facts = first.facts
        raced: list[str] = []

        async def facts(state: Any, command: Any = None, **kw: Any) -> c.Facts:
            seen = await real_facts(state, command, **kw)  # the slot looks free...
            if not raced and isinstance(command, c.CreateGoal):
                raced.append("b")
                await second.execute(_create("b"), Ctx.new())  # ...and another writer lands meanwhile
            return seen

        first.facts = facts  # type: ignore[method-assign]
        with pytest.raises(RuleError, match=r"Workspace-writing goal \"b\" \(b\) is already active"):
            await first.execute(_create("a"), Ctx.new())
        active = [g.goal_id for g in await first.goals() if g.status == "active" and g.config.workspace_write]
        assert raced == ["b"] and active == ["b"]
        (slot,) = [r for r in await store.coord_read(KEY) if r.key == KEY]
        assert not slot.holder and slot.token == 2  # taken by b, then by a's second look; both released
        assert "goal.writer_slot_taken" not in [
            e.type async for e in store.read_all()
        ]  # no bookkeeping events


async def test_a_read_only_goal_takes_no_slot(tmp_path: Path) -> None:
    async with await open_store(f"sqlite:{tmp_path / 'log.db'}") as store:
        service = GoalService(store, SimulatedHost(HostScript()))
        command = c.CreateGoal(
            goal_id="r", name="r", objective="o", owner_session_id="o", workspace_write=False
        )
        assert await service.execute(command, Ctx.new())
        assert await store.coord_read(KEY) == []
