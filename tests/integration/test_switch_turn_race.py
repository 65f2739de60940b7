"""A model switch whose host call is held open while a second process acts on the same goal (#10.2).

The first process (this test) runs ``switch_identity`` with the simulated host's ``switch_model`` held open. A
second, real process (``loopd-es goal ...``) meanwhile asks for another switch and for a turn. Every decision is
taken on the goal's current stream version, so the second switch is deferred and survives the first one's
outcome, and no turn starts (let alone prompts with the identity being replaced) until the switch is settled.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest

from loopd_es.app.goals import Goals
from loopd_es.app.service import Ctx, GoalService
from loopd_es.host.simulated import SimulatedHost
from loopd_es.log import open_store
from tests.waits import scaled_timeout

if TYPE_CHECKING:
    from loopd_es.log.base import LogStore

pytestmark = pytest.mark.anyio

OLD, NEW, LATER = "openai/gpt-5", "openai/gpt-5-mini", "anthropic/claude-sonnet-4-5"


async def held(workdir: Path, goal_id: str) -> tuple[LogStore, SimulatedHost, Goals, str]:
    """The log (to close), the file-backed host with ``switch_model`` held (every process sees the hold), the
    goal use cases over both, and the goal's worker session."""
    store = await open_store(f"sqlite:{workdir / 'events.db'}", create=False)
    host = SimulatedHost.from_file(workdir / "host.json")
    await host.hold("switch_model")
    goals = Goals(GoalService(store, host))
    return store, host, goals, (await goals.service.load(goal_id)).worker_session_id or ""


async def _cli(workdir: Path, *args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPD_ES_CRASH")}
    env.update(LOOPD_ES_STORE=f"sqlite:{workdir / 'events.db'}", LOOPD_ES_HOST=f"sim:{workdir / 'host.json'}")
    with anyio.fail_after(scaled_timeout(60)):
        done = await anyio.run_process(
            [sys.executable, "-m", "loopd_es", *args], cwd=workdir, env=env, check=False
        )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def _prompts(workdir: Path, session: str) -> list[str | None]:
    snap = await SimulatedHost.from_file(workdir / "host.json").snapshot()
    return [p.model for p in snap.prompts if p.session_id == session]


async def test_a_held_switch_keeps_the_deferred_one_and_no_turn_prompts_the_old_identity(
    tmp_path: Path,
) -> None:
    code, out, err = await _cli(
        tmp_path,
        "goal",
        "create",
        "race",
        "--objective",
        "o",
        "--model",
        OLD,
        "--agent",
        "build",
        "--interactive",
        "--read-only",
    )
    assert code == 0, err
    goal_id = out.splitlines()[0]
    code, _, err = await _cli(tmp_path, "sim", "reply", goal_id)  # the worker answers the first turn
    assert code == 0, err
    for step in (
        ("idle", goal_id),
        ("interactive", goal_id, "off"),
    ):  # first run confirmed, engine turns allowed
        code, _, err = await _cli(tmp_path, "goal", *step)
        assert code == 0, err

    store, host, goals, session = await held(tmp_path, goal_id)
    prompts_before = await _prompts(tmp_path, session)
    reports = []
    try:
        async with anyio.create_task_group() as tg:

            async def switch() -> None:
                reports.append(await goals.switch_identity(goal_id, Ctx.new(), model=NEW))

            tg.start_soon(switch)
            with anyio.fail_after(scaled_timeout(30)):
                await host.wait_held("switch_model")
            # the host call is in flight: another process asks for a second switch, then for a turn
            code, out, err = await _cli(tmp_path, "goal", "switch-identity", goal_id, "--model", LATER)
            assert code == 0 and "deferred" in out, (out, err)
            code, out, err = await _cli(tmp_path, "goal", "idle", goal_id)
            assert code == 0, err
            assert "identity switch is being applied" in out, out
            assert await _prompts(tmp_path, session) == prompts_before  # no prompt with the old identity
            await host.release("switch_model")
        assert reports[0].outcome == "applied"
        goals.service.forget(goal_id)
        state = await goals.service.load(goal_id)
        assert state.config.model == NEW
        assert state.model_pending is not None and state.model_pending.model == LATER  # not lost
    finally:
        await store.aclose()

    # the next turn applies the deferred switch first and prompts with it
    code, _, err = await _cli(tmp_path, "sim", "reply", goal_id)
    assert code == 0, err
    code, out, err = await _cli(tmp_path, "goal", "idle", goal_id)
    assert code == 0 and "turn started" in out, (out, err)
    assert (await _prompts(tmp_path, session))[len(prompts_before) :] == [LATER]
