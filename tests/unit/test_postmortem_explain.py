"""``explain``: the walk over causation ids (and the pending-switch link) from the status event to the first cause."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import msgspec
import pytest

from loopd_es.app.goals import SwitchFailedError
from loopd_es.app.service import Ctx
from loopd_es.cli.main import main
from loopd_es.events import goal as g
from loopd_es.events import run as r
from loopd_es.host.sim_script import FailureRule
from loopd_es.log import LogStore, open_store
from loopd_es.postmortem import build_history, find_goal
from loopd_es.postmortem.explain import Explanation, explain, render_text

from ._saga_harness import world
from .test_postmortem_history import GOAL, Step, chain_steps, eid, make_log

pytestmark = pytest.mark.anyio


async def _explain(store: LogStore, goal: str = GOAL) -> Explanation:
    history = await build_history(store, await find_goal(store, goal), provenance=True)
    return await explain(store, history)


async def test_walks_exactly_the_chain_429_fallback_rejected_switch_blocked(tmp_path: Path) -> None:
    async with await open_store(await make_log(tmp_path)) as store:
        x = await _explain(store)
    assert x.status == "blocked"
    assert [(s.link, s.fact.position, s.fact.type) for s in x.steps] == [
        ("status", 15, "goal.blocked"),
        ("causation", 10, "identity.switch_requested"),
        ("pending", 7, "identity.fallback_prepared"),
        ("causation", 5, "run.failed"),
    ]
    assert [f.position for f in x.steps[0].with_] == [13]  # the host's refusal, same reaction as the block
    assert [f.position for f in x.steps[2].with_] == [6]  # the 429 observed with the fallback
    assert x.steps[1].trigger == "request req-idle"
    assert (x.end_kind, x.end) == ("request", "request req-error started this flow (the first cause; "
                                   "a request is not an event in the log)")  # fmt: skip
    assert x.flows == {"req-idle": [10, 11, 12, 13, 14, 15, 16], "req-error": [5, 6, 7]}
    for needle in ("blocked, because", "refused switch_model p/new (rejected)", "fallback to p/new",
                   "rate-limit (HTTP 429) was observed on model p/old at 2026-12-02T12:00:05.000Z"):  # fmt: skip
        assert needle in x.sentence
    text = "\n".join(render_text(x))
    assert "pending switch set by  #7 identity.fallback_prepared" in text


async def test_a_missing_causation_id_is_said_not_guessed(tmp_path: Path) -> None:
    steps = chain_steps()
    stream, payload, _ = steps[9]
    steps[9] = (stream, payload, None)  # the switch request carries no links; its pending link still holds
    steps[4] = (steps[4][0], steps[4][1], None)
    async with await open_store(await make_log(tmp_path, steps)) as store:
        x = await _explain(store)
    assert [s.fact.position for s in x.steps] == [15, 10, 7, 5]
    assert x.end_kind == "missing" and x.end.startswith("#5 run.failed carries no causation id")
    assert x.flows == {}


async def test_a_cause_outside_the_goal_streams_is_looked_up_or_reported(tmp_path: Path) -> None:
    goal = f"goal-{GOAL}"
    steps: list[Step] = [
        ("maintenance", g.GoalRetried(goal_id="unrelated"), "req-m"),  # 1: an event on an unlinked stream
        (goal, g.GoalCreated(goal_id=GOAL, name="n", objective="o", owner_session_id="o"), 1),  # 2
        (goal, g.GoalBlocked(goal_id=GOAL, reason="stuck", needed="look"), 2),  # 3
    ]
    async with await open_store(await make_log(tmp_path, steps)) as store:
        x = await _explain(store)
    assert [(s.link, s.fact.position, s.fact.stream) for s in x.steps] == [
        ("status", 3, "goal"), ("causation", 2, "goal"), ("causation", 1, "maintenance"),
    ]  # fmt: skip
    assert x.end_kind == "request"

    steps = [
        (goal, g.GoalCreated(goal_id=GOAL, name="n", objective="o", owner_session_id="o"), "req"),
        (goal, r.RunStarted(goal_id=GOAL, run_id="x", generation=1, prompt_message_id="m", turn_count=1), 1),
    ]
    (tmp_path / "two").mkdir()
    async with await open_store(await make_log(tmp_path / "two", steps)) as store:
        x = await _explain(store)
    assert (
        x.status == "active"
        and [s.fact.type for s in x.steps] == ["goal.created"]
        and x.end_kind == "request"
    )


async def test_a_dangling_causation_id_is_reported(tmp_path: Path) -> None:
    steps: list[Step] = [
        (f"goal-{GOAL}", g.GoalCreated(goal_id=GOAL, name="n", objective="o", owner_session_id="o"), "req"),
        (f"goal-{GOAL}", g.GoalPaused(goal_id=GOAL), "req"),
    ]
    url = await make_log(tmp_path, steps)
    async with await open_store(url) as store:
        history = await build_history(store, await find_goal(store, GOAL), provenance=True)
    entry = history.entries[1]
    entry.envelope = msgspec.structs.replace(entry.envelope, causation_id="9" * 36)  # a link to nothing
    async with await open_store(url) as store:
        x = await explain(store, history)
    assert x.status == "paused" and x.end_kind == "outside" and "no event in the log has that id" in x.end


async def test_the_engine_writes_chains_explain_can_walk(tmp_path: Path) -> None:
    """The same story told by the goal service and sagas on the simulated host: the walk finds the same chain."""
    async with world(tmp_path) as w:
        gid = await w.create(interactive=False, idle=False, fallback_models=("p/new",))
        await w.goals.observe_error(gid, {"data": {"statusCode": 429, "message": "slow down"}}, Ctx.new())
        await w.host.inject(FailureRule(op="switch_model", error="rejected"))
        w.clock.advance(5)
        await w.replied(gid)
        with pytest.raises(SwitchFailedError):
            await w.goals.idle(gid, Ctx.new())
        x = await _explain(w.store, gid[:8])
    assert [(s.link, s.fact.type) for s in x.steps] == [
        ("status", "goal.blocked"),
        ("causation", "identity.switch_requested"),
        ("pending", "identity.fallback_prepared"),  # a fallback turn: no run.failed before it (#22)
    ]
    assert x.end_kind == "request"
    assert "a rate-limit (HTTP 429) was observed on model p/old" in x.sentence
    assert "the host refused switch_model p/new (rejected)" in x.sentence


def test_cli_explain(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = anyio.run(make_log, tmp_path)
    assert main("--store", url, "explain", "7f3a", "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["status"] == "blocked" and [s["fact"]["event_id"] for s in doc["steps"]] == [
        eid(15),
        eid(10),
        eid(7),
        eid(5),
    ]
    assert doc["steps"][0]["with"][0]["type"] == "saga.host_call_failed"
    assert main("--store", url, "explain", "7f3a") == 0
    out = capsys.readouterr().out
    assert out.startswith(f"goal {GOAL} is blocked\n") and "end of chain  request req-error" in out
    assert main("--store", url, "explain", "zzz") == 2
    assert "no goal matches 'zzz'" in capsys.readouterr().err
