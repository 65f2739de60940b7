"""Roles, who did it and the tools' own language, through the real tool channel (#22, items 6, 7 and 9).

Real processes: ``loopd-es opencode install``, ``loopd-es run`` (simulated host, SQLite log) and the installed
``.opencode/tool/*.ts`` files run by the Bun inside the pinned OpenCode binary, each call carrying the session,
message and call ids OpenCode hands a custom tool. The last test needs no OpenCode: an engine told to drive
OpenCode in a directory without the tool channel refuses to start.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .test_tool_channel import Project, project

__all__ = ["project"]  # the fixture, shared with the channel's own tests


def _call(p: Project, tool: str, args: dict[str, Any], session: str, call: str) -> dict[str, Any]:
    return p.call(tool, args, session=session, call=call)


@pytest.mark.slow
def test_roles_are_the_engines_and_the_completing_call_is_on_record(project: Project) -> None:
    project.start_engine()
    create = {"name": "docs", "objective": "o", "workspaceWrite": False}  # read-only: no checks to run
    created = _call(project, "loopd_create_goal", create, "ses_owner", "c1")
    assert created["ok"] is True, created
    goal_id = created["goalID"]
    shown = json.loads(project.cli("goal", "show", goal_id, "--json").stdout)
    worker = shown["goal"]["worker_session_id"]

    # item 6: the worker's session may not act as an owner, whatever its tools map says
    for tool, args in (("loopd_create_goal", {"name": "mine", "objective": "o"}), ("pause_goal", {})):
        refused = _call(project, tool, args, worker, "c2")
        assert refused["ok"] is False and refused["errorCode"] == "wrong_role", refused
    assert (
        _call(project, "complete_goal", {"summary": "s", "evidence": "e"}, "ses_owner", "c3")["errorCode"]
        == "wrong_role"
    )
    listed = _call(project, "list_background_goals", {}, "ses_owner", "c4")
    assert [g["name"] for g in listed["goals"]] == ["docs"]

    # item 9: the tools name the model at fault and tools, not shell commands; nothing is stored
    unusable = _call(
        project,
        "loopd_create_goal",
        {"name": "x", "objective": "o", "model": "openai/nope"},
        "ses_owner",
        "c5",
    )
    assert unusable["ok"] is False and 'Model "openai/nope" is unavailable' in unusable["message"], unusable
    assert "loopd_list_models" in unusable["message"] and "loopd-es" not in unusable["message"]

    # item 7: the worker completes (the goal's checks pass), and the record says who, in which call
    done = _call(project, "complete_goal", {"summary": "written", "evidence": "read it"}, worker, "call_done")
    assert done["ok"] is True and done["status"] == "complete", done
    project.stop_engine()
    said = f"completed by worker session {worker} (call call_done) with complete_goal, message msg_call_done"
    history = project.cli("history", goal_id)
    assert history.returncode == 0 and said in history.stdout, history.stdout
    explained = project.cli("explain", goal_id)
    assert explained.returncode == 0 and said in explained.stdout, explained.stdout
    assert "a request is not an event" not in explained.stdout
    page = project.dir / "timeline.html"
    timeline = project.cli("history", goal_id, "--html", str(page))
    assert timeline.returncode == 0, timeline.stderr
    assert said in page.read_text()
    streams = project.cli("streams")
    assert streams.stdout.count("goal-") == 1  # the refused goals stored nothing


def test_an_engine_driving_opencode_without_its_tool_channel_refuses_to_start(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "loopd_es", "run", "--host", "opencode:http://127.0.0.1:9"],
        cwd=tmp_path,
        env={
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
            "LOOPD_ES_STORE": f"sqlite:{tmp_path / 'e.db'}",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.splitlines()) == 1 and "`loopd-es opencode install`" in done.stderr
    assert not (tmp_path / "e.db").exists()  # refused before the log was opened
