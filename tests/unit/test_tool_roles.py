"""The engine checks roles itself and records who did what (issue #22, items 6 and 7), at the dispatcher.

Real operations on a real SQLite log and the simulated host; the same flows through the installed tool files
and ``loopd-es run`` are in ``tests/integration/test_tool_roles.py``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from loopd_es.app.goals import Goals
from loopd_es.app.service import GoalService
from loopd_es.domain.streams import goal_stream
from loopd_es.engine.tool_api import ToolCall, ToolDispatcher
from loopd_es.events import identity as i
from loopd_es.events.catalogue import new_event
from loopd_es.postmortem.explain import explain
from loopd_es.postmortem.history import build_history, render_text
from loopd_es.postmortem.links import find_goal

from ._engine_harness import Rig, rig

pytestmark = pytest.mark.anyio


async def _call(
    d: ToolDispatcher, tool: str, session: str, call: str = "call_1", **args: Any
) -> dict[str, Any]:
    context = {"sessionID": session, "messageID": f"msg_of_{call}", "callID": call}
    return await d.call(ToolCall(tool=tool, args=args, context=context))


@asynccontextmanager
async def _tools(tmp_path: Path) -> AsyncIterator[tuple[Rig, ToolDispatcher, str, str]]:
    """A rig, its tool dispatcher, and a goal created through ``loopd_create_goal`` (id, worker session)."""
    async with rig(tmp_path) as r:
        d = ToolDispatcher(r.store, r.host, r.clock, str(tmp_path))
        yield (r, d, *await _worker(r, d))


async def _worker(r: Rig, d: ToolDispatcher) -> tuple[str, str]:
    created = await _call(d, "loopd_create_goal", "ses_owner", name="g", objective="o", workspaceWrite=False)
    assert created["ok"] is True, created
    worker = (await r.state(created["goalID"])).worker_session_id
    assert worker is not None
    return created["goalID"], worker


async def test_a_worker_session_is_refused_every_owner_tool(tmp_path: Path) -> None:
    async with _tools(tmp_path) as (r, d, goal_id, worker):
        for tool, args in (
            ("loopd_create_goal", {"name": "mine", "objective": "o"}),
            ("pause_goal", {"goal_id": goal_id}),
            ("list_background_goals", {}),
            ("loopd_command_start", {"title": "t", "command": "true"}),
        ):
            refused = await _call(d, tool, worker, **args)
            assert refused["ok"] is False and refused["errorCode"] == "wrong_role", (tool, refused)
            assert f"{tool} is an owner tool" in refused["message"] and goal_id in refused["message"]
        assert [g.name for g in await r.ops.service.goals()] == ["g"]  # the worker owns nothing
        assert (await r.state(goal_id)).status == "active"
        owner_asks = await _call(d, "complete_goal", "ses_owner", summary="s", evidence="e")
        assert (
            owner_asks["errorCode"] == "wrong_role"
            and "complete_goal is a worker tool" in owner_asks["message"]
        )
        assert (await _call(d, "get_goal", worker))["ok"] is True


async def test_the_tool_call_that_completed_a_goal_is_in_its_events_history_and_explanation(
    tmp_path: Path,
) -> None:
    async with _tools(tmp_path) as (r, d, goal_id, worker):
        done = await _call(d, "complete_goal", worker, call="call_42", summary="done", evidence="ran it")
        assert done["ok"] is True and done["status"] == "complete", done
        events = [e async for e in r.store.read_stream(f"goal-{goal_id}")]
        by_type = {e.type: e.data_dict() for e in events}
        assert by_type["goal.created"]["called_by"] == {
            "role": "owner",
            "session_id": "ses_owner",
            "tool": "loopd_create_goal",
            "message_id": "msg_of_call_1",
            "call_id": "call_1",
        }
        assert by_type["goal.completed"]["called_by"]["call_id"] == "call_42"
        assert by_type["run.started"].get("called_by") is None  # an engine fact: caused, not called
        history = await build_history(r.store, await find_goal(r.store, goal_id), provenance=True)
        said = (
            f"completed by worker session {worker} (call call_42) with complete_goal, message msg_of_call_42"
        )
        assert any(line.strip() == said for line in render_text(history))
        why = await explain(r.store, history)
        assert said in why.sentence and why.end_kind == "request"
        assert "a request is not an event" not in why.end


async def test_nudge_goal_during_a_switch_says_queued_and_the_turn_runs_once_when_it_is_settled(
    tmp_path: Path,
) -> None:
    async with _tools(tmp_path) as (r, d, goal_id, worker):
        state = await r.state(goal_id)
        flight = i.IdentitySwitchRequested(goal_id=goal_id, switch_id="sw-held", model="openai/gpt-5-mini")
        await r.store.append(goal_stream(goal_id), [new_event(flight)], state.version)  # a switch in flight
        runs = (await r.state(goal_id)).run_count
        nudged = await _call(d, "nudge_goal", "ses_owner", goal_id=goal_id)
        assert nudged["ok"] is True and nudged["title"] == "Goal nudged", nudged
        assert nudged["message"].startswith('Turn queued for "g": an identity switch is being applied')
        assert (await r.state(goal_id)).run_count == runs  # not now: the switch is in flight
        again = await _call(d, "nudge_goal", "ses_owner", call="call_2", goal_id=goal_id)
        assert again["message"].startswith("Turn queued")
        await Goals(GoalService(r.store, r.host, clock=r.clock)).recover()  # its process died: settled
        after = await r.state(goal_id)
        assert after.switch_in_flight is None and after.turn_requested is None
        assert after.run_count == runs + 1  # two requests, one turn
        assert (await r.types(goal_id)).count("goal.turn_requested") == 1
