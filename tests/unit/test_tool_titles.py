"""Tool calls carry the reference's titles (issue #22, item 3): the engine's reply names it, the tool file shows it.

The dispatcher runs real operations (real checks) on the simulated host; the rendered tool file is run by node
when it is installed, to show that OpenCode gets ``{title, output}`` with the title out of the output.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from loopd_es.engine.opencode_tools import render
from loopd_es.engine.tool_api import TOOLS, ToolCall, ToolDispatcher

from ._engine_harness import Rig, rig

pytestmark = pytest.mark.anyio


async def _call(d: ToolDispatcher, tool: str, session: str, **args: Any) -> dict[str, Any]:
    return await d.call(ToolCall(tool=tool, args=args, context={"sessionID": session}))


async def _create(r: Rig, d: ToolDispatcher, name: str, *checks: str) -> str:
    """A goal created through the owner tool (its title checked); returns its worker session."""
    args: dict[str, Any] = {"name": name, "objective": "o", "workspaceWrite": False, "checks": list(checks)}
    created = await _call(d, "loopd_create_goal", "owner-1", **args)
    assert created["title"] == "Goal created", created
    return (await r.state(created["goalID"])).worker_session_id or ""


async def test_completion_titles_say_keep_working_then_goal_blocked(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        d = ToolDispatcher(r.store, r.host, r.clock, str(tmp_path))
        sid = await _create(r, d, "g", "false")
        assert (await _call(d, "get_goal", sid))["title"] == "Goal: g"
        progress = await _call(d, "report_goal_progress", sid, summary="s", next="n")
        assert progress["title"] == "Progress recorded"
        for _ in range(2):  # the reference's limit is three rejections
            first = await _call(d, "complete_goal", sid, summary="s", evidence="e")
            assert first["title"] == "Completion rejected — keep working" and first["status"] == "active"
        second = await _call(d, "complete_goal", sid, summary="s", evidence="e")
        assert second["title"] == "Completion rejected — goal blocked" and second["status"] == "blocked"
        assert second["message"] == "Evaluator rejection limit reached. Goal blocked; owner retry required."
        again = await _call(d, "complete_goal", sid, summary="s", evidence="e")
        assert again["title"] == "Invalid transition", again
        assert (await _call(d, "get_goal", "ses_nobody"))["title"] == "No active goal"
        assert (await _call(d, "report_goal_progress", "ses_nobody", summary="s", next="n"))[
            "title"
        ] == "No goal"


async def test_a_completed_and_a_blocked_goal_have_their_titles(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        d = ToolDispatcher(r.store, r.host, r.clock, str(tmp_path))
        sid_a, sid_b = await _create(r, d, "a", "true"), await _create(r, d, "b")
        assert (await _call(d, "complete_goal", sid_a, summary="s", evidence="e"))[
            "title"
        ] == "Goal completed"
        assert (await _call(d, "block_goal", sid_b, reason="r", needed="n"))["title"] == "Goal blocked"
        assert (await _call(d, "block_goal", sid_b, reason="r", needed="n"))["title"] == "Invalid transition"
        refused = await _call(d, "loopd_create_goal", "owner-1", name="", objective="")
        assert refused["title"] == "Goal not created", refused


@pytest.mark.skipif(shutil.which("node") is None, reason="node runs the rendered tool file")
def test_the_tool_file_hands_the_title_to_opencode_and_keeps_it_out_of_the_output(tmp_path: Path) -> None:
    source = render(TOOLS["complete_goal"])
    body = source.split("const text = await reply.text()", 1)[1].split("} catch (e) {", 1)[0]
    script = (
        "const run = async (text) => {" + body + "};\n"
        "(async () => { for (const t of process.argv.slice(2)) console.log(JSON.stringify(await run(t))) })()\n"
    )
    (tmp_path / "t.js").write_text(script)
    reply = json.dumps({"ok": False, "title": "Completion rejected — goal blocked", "status": "blocked"})
    out = subprocess.run(
        ["node", str(tmp_path / "t.js"), reply, "not json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout.splitlines()
    first = json.loads(out[0])
    assert first["title"] == "Completion rejected — goal blocked"
    assert json.loads(first["output"]) == {"ok": False, "status": "blocked"}
    assert json.loads(out[1]) == "not json"


async def test_owner_tools_have_the_reference_titles(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        d = ToolDispatcher(r.store, r.host, r.clock, str(tmp_path))
        assert (await _call(d, "list_background_goals", "owner-1"))["title"] == "No active goals"
        await _create(r, d, "g")
        listed = await _call(d, "list_background_goals", "owner-1")
        assert listed["title"] == "1 active goal(s)"
        goal_id = listed["goals"][0]["id"]
        assert (await _call(d, "send_goal_input", "owner-1", text="hi"))["title"] == "Message sent"
        assert (await _call(d, "nudge_goal", "owner-1"))["title"] == "Goal nudged"
        assert (await _call(d, "abort_goal_worker", "owner-1"))["title"] == "Worker aborted"
        assert (await _call(d, "pause_goal", "owner-1"))["title"] == "Goal paused"
        assert (await _call(d, "pause_goal", "owner-1"))["title"] == "Already paused"
        assert (await _call(d, "resume_goal", "owner-1"))["title"] == "Goal resumed"
        assert (await _call(d, "pause_goal", "someone-else"))["title"] == "No goal found"
        assert (await _call(d, "force_block_goal", "owner-1", reason="r", needed="n"))[
            "title"
        ] == "Goal blocked"
        assert (await _call(d, "force_complete_goal", "owner-1"))["title"] == "Goal force-completed"
        assert (await _call(d, "clear_goal", "owner-1", goal_id=goal_id))["title"] == "Goal cleared"
