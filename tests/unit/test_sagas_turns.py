"""Turns the goal service starts: the force-finish wrap-up turn carries the docs/reference/loopd.md#s3-5
final-report section (#10.4)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from loopd_es.app.goals import Goals
from loopd_es.app.service import Ctx, GoalService
from loopd_es.domain import goal_commands as c
from loopd_es.domain.streams import goal_stream
from loopd_es.host.simulated import SimulatedHost

from ._saga_harness import SCRIPT, world

if TYPE_CHECKING:
    from loopd_es.host.base import SessionIdentity

pytestmark = pytest.mark.anyio

FINAL_REPORT_HEADING = "## FINAL REPORT REQUIRED — STOPPING SOON"  # docs/reference/loopd.md#s3-5, verbatim


async def test_the_force_finish_turn_prompts_for_the_final_report(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        gid = await w.create(interactive=False, idle=False, max_turns=1)
        session = (await w.state(gid)).worker_session_id or ""
        first = await w.prompts(session)
        assert len(first) == 1 and FINAL_REPORT_HEADING not in first[0].text
        await w.replied(gid)
        turn = await w.goals.idle(gid, Ctx.new())  # turn 1 of 1 confirmed: the limit asks for a wrap-up turn
        assert turn.result == "started"
        state = await w.state(gid)
        assert state.force_finish_requested and state.status == "active"
        wrap_up = (await w.prompts(session))[-1]
        assert f"\n{FINAL_REPORT_HEADING}\n" in wrap_up.text and "## INSTRUCTIONS" not in wrap_up.text
        started = [e for e in await w.events(goal_stream(gid)) if e.type == "run.started"]
        assert started[-1].data_dict()["kind"] == "force_finish"
        await w.replied(gid)
        await w.goals.idle(gid, Ctx.new())  # the limit still holds after the wrap-up turn: blocked, no prompt
        state = await w.state(gid)
        assert state.status == "blocked" and state.blocker is not None
        assert state.blocker.reason == "Reached max turns (1) (force-finish ignored)"
        assert len(await w.prompts(session)) == 2


async def test_an_ordinary_continuation_keeps_its_instructions(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        gid = await w.create(interactive=False, idle=True, max_turns=5)
        session = (await w.state(gid)).worker_session_id or ""
        last = (await w.prompts(session))[-1]
        assert last.text.startswith("This is continuation run 2") and "## INSTRUCTIONS" in last.text
        assert FINAL_REPORT_HEADING not in last.text


async def test_create_records_its_worker_on_the_goals_current_version(tmp_path: Path) -> None:
    """#10.2: another writer acts on the new goal while its worker is being created; nothing is lost or raised."""
    async with world(tmp_path) as w:
        other = GoalService(w.store, w.host, clock=w.clock)  # a second process on the same log

        class Racing(SimulatedHost):
            async def create_worker(
                self, *, title: str, model: str | None = None, agent: str | None = None
            ) -> SessionIdentity:
                (goal_id,) = await other.goal_ids()
                await other.execute(c.SetInteractive(goal_id=goal_id, interactive=True), Ctx.new())
                return await super().create_worker(title=title, model=model, agent=agent)

        goals = Goals(GoalService(w.store, Racing(SCRIPT, clock=w.clock), clock=w.clock))
        state = await goals.create("g", "o", Ctx.new(), model="p/old", agent="old", workspace_write=False)
        assert state.worker_session_id is not None and state.interactive and state.run_count == 1
        types = [e.type for e in await w.events(goal_stream(state.goal_id))]
        assert types[:4] == [
            "goal.created",
            "goal.interactive_changed",
            "goal.worker_assigned",
            "run.started",
        ]
