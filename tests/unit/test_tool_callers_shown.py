"""Who created, ended and last changed a goal through a tool is shown where a goal is shown (issue #22, item 7).

A real SQLite log and the simulated host, calls through the tool dispatcher as OpenCode's tool files make them;
``goals --json``, ``goal show`` (text and JSON) and ``explain`` run as the CLI, the dashboard's goal pane is
rendered from the read model's row.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from loopd_es.dash.app import render_goal
from loopd_es.dash.data import goal_detail
from loopd_es.domain.evolve import fold, initial
from loopd_es.engine.tool_api import ToolCall, ToolDispatcher

from ._engine_harness import rig

pytestmark = pytest.mark.anyio

CREATED = "created by owner session ses_owner (call c1) with loopd_create_goal, message msg_c1"


async def _call(d: ToolDispatcher, tool: str, session: str, call: str, **args: Any) -> dict[str, Any]:
    context = {"sessionID": session, "messageID": f"msg_{call}", "callID": call}
    return await d.call(ToolCall(tool=tool, args=args, context=context))


def _cli(tmp_path: Path, *args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "loopd_es", *args], cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env={**os.environ, "LOOPD_ES_STORE": f"sqlite:{tmp_path / 'events.db'}"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


async def test_goals_goal_show_explain_and_the_dashboard_say_who_acted(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        d = ToolDispatcher(r.store, r.host, r.clock, str(tmp_path))
        made = await _call(
            d, "loopd_create_goal", "ses_owner", "c1", name="g", objective="o", workspaceWrite=False
        )
        assert made["ok"], made
        goal_id = made["goalID"]
        worker = (await r.state(goal_id)).worker_session_id
        assert worker is not None
        assert (await _call(d, "send_goal_input", "ses_owner", "c2", goal_id=goal_id, text="hurry"))["ok"]
        done = await _call(d, "complete_goal", worker, "c3", summary="done", evidence="ran it")
        assert done["ok"], done
        state = await r.state(goal_id)
    assert state.created_by is not None and state.created_by.call_id == "c1"
    assert state.controlled_by is not None and state.controlled_by.call_id == "c2"
    assert state.ended_by is not None and (state.ended_by.role, state.ended_by.call_id) == ("worker", "c3")

    row = json.loads(_cli(tmp_path, "goals", "--json"))["goals"][0]
    assert row["created_by"] == {
        "role": "owner", "session_id": "ses_owner", "tool": "loopd_create_goal", "message_id": "msg_c1",
        "call_id": "c1",
    }  # fmt: skip
    assert row["ended_by"]["session_id"] == worker and row["ended_by"]["tool"] == "complete_goal"
    assert row["controlled_by"]["tool"] == "send_goal_input"
    shown = json.loads(_cli(tmp_path, "goal", "show", goal_id, "--json"))["goal"]
    assert (shown["created_by"], shown["ended_by"], shown["controlled_by"]) == (
        row["created_by"], row["ended_by"], row["controlled_by"],
    )  # fmt: skip
    text = _cli(tmp_path, "goal", "show", goal_id)
    completed = f"completed by worker session {worker} (call c3) with complete_goal, message msg_c3"
    for said in (
        CREATED,
        completed,
        "last changed by owner session ses_owner (call c2) with send_goal_input",
    ):
        assert said in text, text
    why = _cli(tmp_path, "explain", goal_id)
    assert completed in why and CREATED in why, why
    assert "last changed by owner session ses_owner (call c2) with send_goal_input" in why, why
    assert json.loads(_cli(tmp_path, "explain", goal_id, "--json"))["who"][0] == CREATED

    pane = render_goal(goal_detail(tmp_path / "read.db", goal_id)).plain
    assert CREATED in pane and completed in pane, pane


async def test_a_goal_made_by_the_cli_or_an_old_log_names_no_tool_call(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        made = await r.ops.create("g", "o", workspace_write=False)
        assert made.goal_id is not None
        state = await r.state(made.goal_id)
        events = [e async for e in r.store.read_stream(f"goal-{made.goal_id}")]
    assert (state.created_by, state.ended_by, state.controlled_by) == (None, None, None)
    # a goal.created written before called_by existed: the field is absent from the stored payload
    first = events[0]
    data = first.data_dict()
    data["called_by"] = {"role": "owner", "session_id": "s", "tool": "loopd_create_goal"}
    with_caller = msgspec.structs.replace(first, data=msgspec.Raw(json.dumps(data).encode()))
    assert fold([with_caller], initial(made.goal_id)).created_by is not None
    del data["called_by"]  # as a log written before the field existed stores it
    without = msgspec.structs.replace(first, data=msgspec.Raw(json.dumps(data).encode()))
    assert fold([without], initial(made.goal_id)).created_by is None
    row = json.loads(_cli(tmp_path, "goals", "--json"))["goals"][0]
    assert (row["created_by"], row["ended_by"], row["controlled_by"]) == (None, None, None)
    assert "  by  " not in _cli(tmp_path, "goal", "show", made.goal_id)
