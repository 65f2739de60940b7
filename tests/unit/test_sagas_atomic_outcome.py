"""A switch's goal outcome and the saga step that decides it land in one atomic append (#9 item 14).

Crash the combined switch at every crash point: whatever survives, the log never holds a goal outcome for
the switch without the saga's ``saga.switch_finished`` beside it (same append: one timestamp, nothing between).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from loopd_es.app.crashpoints import Crash, arm
from loopd_es.app.service import Ctx
from loopd_es.host.sim_script import FailureRule
from loopd_es.sagas.identity_switch import _OUTCOME_TYPES

from ._saga_harness import SCRIPT, world

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("rejected", [False, True], ids=["applied", "rolled-back"])
@pytest.mark.parametrize("crash_at", [None, *range(1, 25)])
async def test_no_goal_outcome_without_its_saga_step(
    tmp_path: Path, crash_at: int | None, rejected: bool
) -> None:
    async with world(tmp_path, SCRIPT) as w:
        gid = await w.create()
        if rejected:
            await w.host.inject(FailureRule(op="switch_agent", error="rejected", on_call=1))
        arm(crash_at)
        try:
            await w.goals.switch_identity(gid, Ctx.new(), model="p/new", agent="new")
        except Crash:
            pass
        finally:
            arm(None)
        log = await w.events()
        outcomes = [e for e in log if e.type in _OUTCOME_TYPES]
        for outcome in outcomes:
            finished = [
                e
                for e in log
                if e.type == "saga.switch_finished"
                and e.data_dict()["switch_id"] == outcome.data_dict()["switch_id"]
            ]
            assert finished, f"crash point {crash_at}: {outcome.type} recorded without the saga's finish"
            one_append = log[outcome.position - 1 : finished[0].position]
            assert {e.recorded_at for e in one_append} == {outcome.recorded_at}, "not written in one append"
        if crash_at is None:
            assert outcomes
