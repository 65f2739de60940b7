"""The goal tools answer in the reference's shapes: ``inspect_background_goal`` exists (the owner notices name
it), ``loopd_list_models`` is the catalogs plus ``agentCatalog`` and ``assignedGoals`` (a worker sees none),
``get_goal``, ``complete_goal``, ``loopd_create_goal`` and ``list_background_goals`` use the reference's field
names (docs/reference/loopd.md#s3-1, #s3-16, #s3-21, #s3-22). Real operations, real checks, real SQLite.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from loopd_es.engine.tool_api import TOOLS, ToolCall, ToolDispatcher
from loopd_es.engine.tool_views import QUOTA_OF_GOAL, QUOTA_OF_ROW

from ._engine_harness import Rig, rig

pytestmark = pytest.mark.anyio
OWNER = "owner-1"


async def _call(d: ToolDispatcher, tool: str, session: str = OWNER, **args: Any) -> dict[str, Any]:
    return await d.call(ToolCall(tool=tool, args=args, context={"sessionID": session}))


async def _goal(r: Rig, d: ToolDispatcher, name: str = "g", **options: Any) -> tuple[str, str]:
    created = await _call(d, "loopd_create_goal", name=name, objective="o", workspaceWrite=False, **options)
    assert created["ok"] is True, created
    return created["goalID"], created["workerSessionID"]


def _snake(value: Any) -> list[str]:
    """Every key under ``value`` that is snake_case (the engine's own names, not the reference's)."""
    if isinstance(value, dict):
        return [k for k in value if "_" in k] + [x for v in value.values() for x in _snake(v)]
    if isinstance(value, list):
        return [x for v in value for x in _snake(v)]
    return []


async def test_inspect_shows_the_goal_in_full_and_what_its_worker_does(tmp_path: Path) -> None:
    assert TOOLS["inspect_background_goal"].role == "owner"
    async with rig(tmp_path) as r:
        d = ToolDispatcher(r.store, r.host, r.clock, str(tmp_path))
        gid, worker = await _goal(r, d, fallbackModels=["openai/gpt-5-mini"])
        assert (await _call(d, "report_goal_progress", worker, summary="step one", next="step two"))["ok"]
        await _call(d, "pause_goal", goal_id=gid)
        assert (await _call(d, "send_goal_input", goal_id=gid, text="later"))["ok"]
        seen = await _call(d, "inspect_background_goal", goal_id=gid, transcriptLimit=2)
        assert seen["ok"] is True and seen["title"] == "Goal: g", seen
        assert (seen["id"], seen["name"], seen["objective"], seen["status"]) == (gid, "g", "o", "paused")
        assert (seen["ownerSessionID"], seen["workerSessionID"]) == (OWNER, worker)
        assert seen["config"]["fallbackModels"] == ["openai/gpt-5-mini"]
        assert seen["config"]["workspaceWrite"] is False and seen["config"]["maxTurns"] == 50
        assert seen["lastProgress"]["summary"] == "step one" and seen["lastProgress"]["next"] == "step two"
        assert [(p["summary"], p["next"]) for p in seen["progressHistory"]] == [("step one", "step two")]
        assert [(i["from"], i["text"]) for i in seen["pendingInbox"]] == [("user", "later")]
        assert seen["quotaLimitation"] == QUOTA_OF_GOAL
        assert (seen["tokensUsed"], seen["costUsed"]) == (0, 0.0)
        assert seen["runtime"]["phase"] == "idle" and seen["runtime"]["runCount"] == 1
        live = seen["live"]
        assert live["artifactSummary"] == "no artifacts yet" and live["pendingToolCalls"] == 0
        assert 1 <= len(live["transcriptTail"]) <= 2 and live["transcriptTail"][0]["role"] == "user"
        assert not _snake(seen), _snake(seen)

        quick = await _call(d, "inspect_background_goal", goal_id=gid, includeTranscript=False)
        assert "transcriptTail" not in quick["live"]
        assert await _call(d, "inspect_background_goal", "someone-else", goal_id=gid) == {
            "ok": False,
            "message": "No matching active goal for this session.",
            "title": "No goal found",
        }
        refused = await _call(d, "inspect_background_goal", worker)
        assert refused["errorCode"] == "wrong_role", refused  # owner tools stay the owner's


async def test_list_models_is_the_catalogs_and_the_callers_goals(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        d = ToolDispatcher(r.store, r.host, r.clock, str(tmp_path))
        gid, worker = await _goal(r, d, model="openai/gpt-5", agent="build")
        listed = await _call(d, "loopd_list_models")
        assert listed["ok"] is True and listed["title"] == "Provider/model capabilities"
        for key in ("capability", "source", "observedAt", "switching", "providers", "models", "quota"):
            assert key in listed, key
        model = next(m for m in listed["models"] if m["modelID"] == "gpt-5")
        assert (model["providerID"], model["contextLimit"], model["outputLimit"]) == (
            "openai",
            400_000,
            128_000,
        )
        assert listed["quota"]["limitation"] and listed["quota"]["status"] == "unknown"
        assert listed["agents"] == listed["agentCatalog"]["agents"]
        assert {"name": "plan", "description": "plans without editing"}.items() <= next(
            a for a in listed["agents"] if a["name"] == "plan"
        ).items()
        assert listed["assignedGoals"] == [
            {
                "id": gid,
                "model": "openai/gpt-5",
                "agent": "build",
                "workerSessionID": worker,
                "fallbackModels": [],
            }
        ]
        assert not _snake(listed), _snake(listed)
        as_worker = await _call(d, "loopd_list_models", worker)
        assert as_worker["ok"] is True and as_worker["assignedGoals"] == [], as_worker


async def test_get_goal_is_the_reference_structure(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        d = ToolDispatcher(r.store, r.host, r.clock, str(tmp_path))
        gid, worker = await _goal(r, d, checks=["true"], maxFailures=4)
        got = await _call(d, "get_goal", worker)
        assert got["title"] == "Goal: g" and got["ok"] is True
        assert (got["id"], got["name"], got["status"], got["workerSessionID"]) == (gid, "g", "active", worker)
        assert got["config"]["checks"] == ["true"] and got["config"]["maxFailures"] == 4
        assert got["runtime"]["runCount"] == 1 and got["runtime"]["budgetTurnCount"] == 1
        assert got["tokensUsed"] == 0 and got["timeUsedSeconds"] == 0
        assert "data" not in got and not _snake(got), _snake(got)


async def test_complete_goal_answers_in_the_reference_fields(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        d = ToolDispatcher(r.store, r.host, r.clock, str(tmp_path))
        gid, worker = await _goal(r, d, checks=["echo out; echo err >&2; exit 3"])
        rejected = await _call(d, "complete_goal", worker, summary="s", evidence="e")
        assert rejected == {
            "ok": False,
            "goalID": gid,
            "goalName": "g",
            "passed": False,
            "failedChecks": [
                {
                    "command": "echo out; echo err >&2; exit 3",
                    "exitCode": 3,
                    "stderr": "err\n",
                    "stdout": "out\n",
                }
            ],
            "message": "Evaluator rejected completion. Fix the issues above and try again.",
            "rejectionCount": 1,
            "status": "active",
            "title": "Completion rejected — keep working",
        }
        other, sid = await _goal(r, d, "h", checks=["true"])
        done = await _call(d, "complete_goal", sid, summary="s", evidence="e")
        assert {k: done[k] for k in ("goalID", "goalName", "status", "summary", "evidence", "title")} == {
            "goalID": other,
            "goalName": "h",
            "status": "complete",
            "summary": "s",
            "evidence": "e",
            "title": "Goal completed",
        }


async def test_create_says_which_defaults_it_applied_and_the_worker_topology(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        d = ToolDispatcher(r.store, r.host, r.clock, str(tmp_path))
        explicit = await _call(
            d,
            "loopd_create_goal",
            name="a",
            objective="o",
            workspaceWrite=False,
            model="openai/gpt-5",
            agent="plan",
        )
        assert explicit["defaultsApplied"] == {"agent": False, "model": False, "checks": False}, explicit
        state = await r.state(explicit["goalID"])
        assert explicit.get("workerTopology") == state.topology and explicit.get("nativeParentID") is None
        await _call(d, "pause_goal", goal_id=explicit["goalID"])  # one writer at a time
        writer = await _call(d, "loopd_create_goal", name="b", objective="o")
        assert writer["ok"] is True and writer["defaultsApplied"]["checks"] is True, writer
        assert writer["checks"] == ["bun test"]
        await _call(d, "pause_goal", goal_id=writer["goalID"])
        blank = await _call(d, "loopd_create_goal", name="c", objective="o", checks=[" "], agent="  ")
        assert blank["ok"] is True and blank["checks"] == ["bun test"], blank  # a blank check is none
        assert blank["defaultsApplied"]["checks"] is True, blank  # once False: the raw [" "] counted as given


async def test_list_rows_carry_turns_progress_blocker_and_identity(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        d = ToolDispatcher(r.store, r.host, r.clock, str(tmp_path))
        gid, worker = await _goal(r, d, fallbackModels=["openai/gpt-5-mini"], maxTurns=9)
        await _call(d, "report_goal_progress", worker, summary="x" * 200, next="n")
        await _call(d, "switch_goal_identity", goal_id=gid, agent="plan")  # deferred: its turn runs
        await _call(d, "force_block_goal", goal_id=gid, reason="r" * 200, needed="n")
        done, _ = await _goal(r, d, "done")
        await _call(d, "force_complete_goal", goal_id=done)
        listed = await _call(d, "list_background_goals")
        assert listed["title"] == "1 active goal(s)" and [row["id"] for row in listed["goals"]] == [gid]
        row = listed["goals"][0]
        assert (row["status"], row["turn"], row["budgetTurnCount"], row["maxTurns"]) == ("blocked", 1, 1, 9)
        assert row["lastProgress"] == "x" * 120 and row["lastProgressAt"].endswith("Z")
        assert row["blocker"] == "r" * 120
        assert row["agentSwitch"]["pending"]["agent"] == "plan"
        assert row["fallbackModels"] == ["openai/gpt-5-mini"] and row["quotaLimitation"] == QUOTA_OF_ROW
        assert not _snake(listed), _snake(listed)
