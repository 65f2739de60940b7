"""The owner and worker tools follow the reference's rules where a tester found them apart.

``switch_goal_identity`` takes ``resume`` (docs/reference/loopd.md#s3-10) and answers with the reference's
titles and fields; an empty model or agent is refused, not dropped; ``report_goal_progress`` is ``{summary,
next, evidence?}`` (#s3-16); ``resume_goal`` leaves a goal that is neither paused nor blocked as it is (#s3-4);
``send_goal_input`` with nothing to send says so (#s3-7). Real operations on the simulated host and a real
SQLite log.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from loopd_es.engine.opencode_tools import render
from loopd_es.engine.tool_api import TOOLS, ToolCall, ToolDispatcher
from loopd_es.engine.tool_switch import RETAINED
from loopd_es.sagas.identity_switch import REJECTED

from ._engine_harness import Rig, rig

pytestmark = pytest.mark.anyio
OWNER = "owner-1"


async def _call(d: ToolDispatcher, tool: str, session: str = OWNER, **args: Any) -> dict[str, Any]:
    return await d.call(ToolCall(tool=tool, args=args, context={"sessionID": session}))


async def _goal(r: Rig, d: ToolDispatcher, name: str = "g") -> str:
    created = await _call(d, "loopd_create_goal", name=name, objective="o", workspaceWrite=False)
    assert created["ok"] is True, created
    goal_id: str = created["goalID"]
    return goal_id


def test_the_switch_tool_file_offers_resume() -> None:
    source = render(TOOLS["switch_goal_identity"])
    assert "resume: tool.schema.boolean().optional()" in source
    assert TOOLS["switch_goal_identity"].required() == ("goal_id",)


async def test_switch_with_resume_resumes_a_blocked_goal_on_the_same_worker(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        d = ToolDispatcher(r.store, r.host, r.clock, str(tmp_path))
        gid = await _goal(r, d)
        before = await r.state(gid)
        assert (await _call(d, "force_block_goal", goal_id=gid, reason="r", needed="n"))["ok"]
        switched = await _call(
            d, "switch_goal_identity", goal_id=gid, model="openai/gpt-5-mini", agent="plan", resume=True
        )
        assert switched == {
            "ok": True,
            "outcome": "applied",
            "model": "openai/gpt-5-mini",
            "agent": "plan",
            "resumed": True,
            "goalID": gid,
            "message": RETAINED,
            "title": "Identity switch: applied",
        }
        after = await r.state(gid)
        assert after.status == "active" and after.worker_session_id == before.worker_session_id
        assert (after.config.model, after.config.agent) == ("openai/gpt-5-mini", "plan")
        assert after.run_count == before.run_count + 1  # the resumed goal got its turn


async def test_a_switch_the_rules_refuse_answers_the_fixed_rejection_and_changes_nothing(
    tmp_path: Path,
) -> None:
    async with rig(tmp_path) as r:
        d = ToolDispatcher(r.store, r.host, r.clock, str(tmp_path))
        gid = await _goal(r, d)
        before = await r.state(gid)
        head = await r.store.head()
        for args in (
            {"model": "", "agent": "plan"},  # an empty model is not an agent-only switch
            {"model": "openai/gpt-5-mini", "agent": ""},
            {"agent": "plan", "resume": True},  # resume only for a blocked goal
            {"model": "not a model"},
        ):
            answer = await _call(d, "switch_goal_identity", goal_id=gid, **args)
            assert answer == {"ok": False, "message": REJECTED, "title": "Identity switch failed"}, args
        assert await r.store.head() == head
        after = await r.state(gid)
        assert (after.config.model, after.config.agent) == (before.config.model, before.config.agent)


async def test_switch_refusals_before_the_switch_have_their_own_titles(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        d = ToolDispatcher(r.store, r.host, r.clock, str(tmp_path))
        gid = await _goal(r, d)
        denied = {
            "ok": False,
            "message": "Goal not found or not owned by this session.",
            "title": "Switch denied",
        }
        assert await _call(d, "switch_goal_identity", "someone-else", goal_id=gid, agent="plan") == denied
        assert await _call(d, "switch_goal_identity", goal_id="", agent="plan") == denied
        assert await _call(d, "switch_goal_identity", goal_id=gid) == {
            "ok": False,
            "message": "At least one of model or agent is required.",
            "title": "Identity switch failed",
        }
        deferred = await _call(d, "switch_goal_identity", goal_id=gid, agent="plan")  # its first turn runs
        assert deferred == {
            "ok": True,
            "outcome": "deferred",
            "agent": "plan",
            "goalID": gid,
            "message": RETAINED,
            "title": "Identity switch: deferred",
        }


async def test_progress_takes_next_and_optional_evidence(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        d = ToolDispatcher(r.store, r.host, r.clock, str(tmp_path))
        gid = await _goal(r, d)
        worker = (await r.state(gid)).worker_session_id or ""
        with_evidence = await _call(d, "report_goal_progress", worker, summary="s", next="n", evidence="e")
        assert with_evidence["ok"] is True and with_evidence["title"] == "Progress recorded", with_evidence
        progress = (await r.state(gid)).last_progress
        assert progress is not None and (progress.summary, progress.next) == ("s", "n")
        recorded = [e async for e in r.store.read_stream(f"goal-{gid}") if e.type == "goal.progress"]
        assert recorded[-1].data_dict()["evidence"] == "e"
        without_next = await _call(d, "report_goal_progress", worker, summary="s")
        assert without_next == {"ok": False, "message": "Missing required argument(s): next."}


async def test_resume_leaves_a_complete_goal_complete(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        d = ToolDispatcher(r.store, r.host, r.clock, str(tmp_path))
        gid = await _goal(r, d)
        assert (await _call(d, "force_complete_goal", goal_id=gid))["ok"]
        head = await r.store.head()
        answer = await _call(d, "resume_goal", goal_id=gid)
        assert answer == {  # the reference answers "resumed" here (its bug, #s8-2): this says nothing changed
            "ok": False,
            "title": "Resume failed",
            "goalID": gid,
            "status": "complete",
            "message": 'Goal "g" is complete; only a paused or blocked goal can be resumed. Nothing changed.',
        }, answer
        assert await r.store.head() == head
        assert (await r.state(gid)).status == "complete"
        assert (await _call(d, "resume_goal"))[
            "message"
        ] == "No matching paused/blocked goal for this session."


async def test_sending_nothing_says_nothing_to_send(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        d = ToolDispatcher(r.store, r.host, r.clock, str(tmp_path))
        gid = await _goal(r, d)
        head = await r.store.head()
        for text in ("", "  \n"):
            answer = await _call(d, "send_goal_input", goal_id=gid, text=text)
            assert (answer["ok"], answer["message"], answer["title"]) == (
                False,
                "Nothing to send.",
                "Send failed",
            )
        assert await r.store.head() == head


async def test_resume_goal_makes_the_worker_a_failed_creation_could_not(tmp_path: Path) -> None:
    # the tool path answered "resumed" and left the goal active with no worker (only the CLI made one)
    from loopd_es.host.sim_script import FailureRule

    async with rig(tmp_path) as r:
        d = ToolDispatcher(r.store, r.host, r.clock, str(tmp_path))
        await r.host.inject(FailureRule(op="create_worker", error="unavailable"))
        created = await _call(d, "loopd_create_goal", name="g", objective="o", workspaceWrite=False)
        gid = created["goalID"]
        assert created["ok"] is False and (await r.state(gid)).status == "blocked"
        again = await _call(d, "resume_goal", goal_id=gid)  # the host still refuses: said, not "resumed"
        assert again["ok"] is False and again["message"].startswith('Goal "g" could not start: host '), again
        state = await r.state(gid)
        assert (state.status, state.worker_session_id) == ("blocked", None)
        await r.host.clear_failures()  # the host is back
        resumed = await _call(d, "resume_goal", goal_id=gid)
        assert resumed["ok"] is True and resumed["message"] == 'Goal "g" resumed.', resumed
        state = await r.state(gid)
        assert state.status == "active" and state.worker_session_id is not None and state.run_count == 1
