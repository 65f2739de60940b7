"""``replay --check`` and ``whatif`` on a log a real ``opencode serve`` run wrote (429, fallback, max turns).

The goal runs on a model that answers 429 (OpenCode retries it; the engine falls back to ``fake/other``) and
never completes, so it reaches its three turns, gets its wrap-up turn and is blocked. Every decision of that
run must replay as recorded; a smaller ``max_turns`` must stop it earlier and another fallback order must change
the first fallback, and nothing past that point is claimed.
"""

from __future__ import annotations

import json

import pytest

from .test_opencode_e2e import Stack, cli, create_with_fallback, of_type, stack

__all__ = ["stack"]

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.timeout(240)]


async def test_a_real_run_replays_as_recorded_and_answers_what_if(stack: Stack) -> None:
    stack.fake.worker_script = [("text",)] * 8
    stack.start_engine()
    create_with_fallback(stack, "whatif", "fake/ra30")
    envs = await stack.until(
        "the goal to stop at its turn limit", lambda e: bool(of_type(e, "goal.blocked")), 120
    )
    stack.stop()
    assert of_type(envs, "identity.fallback_prepared") and of_type(envs, "goal.force_finish_requested")
    turns = len(of_type(envs, "run.started"))

    check = cli(stack.project, stack.env, "replay", "--check", "--json")
    assert check.returncode == 0, check.stdout + check.stderr
    body = json.loads(check.stdout)
    assert body["ok"] and body["goals"] == 1 and body["decisions"] >= turns + 2, body

    fewer = cli(stack.project, stack.env, "whatif", "--all", "--set", "max_turns=1", "--json")
    assert fewer.returncode == 0, fewer.stderr
    result = json.loads(fewer.stdout)
    (goal,) = result["goals"]
    assert goal["divergence"]["outcome"] == "stops_earlier", goal
    assert goal["divergence"]["replayed"] == ["run.completed", "goal.force_finish_requested"]
    first_idle = of_type(envs, "run.completed")[0].position  # the 429 turn fell back: it never went idle
    later = [e for e in of_type(envs, "run.started") if e.position > first_idle]
    assert goal["divergence"]["position"] == first_idle
    assert goal["saved_turns"] == len(later) - 1 >= 1  # every later turn but the wrap-up one
    assert result["totals"]["stop_earlier"] == 1 and result["totals"]["saved_turns"] == goal["saved_turns"]
    assert "apply through position" in goal["beyond"]

    other = cli(stack.project, stack.env, "whatif", "--all", "--set", "fallback_models=fake/third,fake/other")
    assert other.returncode == 0, other.stderr
    assert (
        "fall back to fake/third" in other.stdout
        and "where the log recorded: fall back to fake/other" in other.stdout
    )
    assert "assumes fake/third is taken as usable" in other.stdout
