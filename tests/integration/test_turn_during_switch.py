"""A turn an owner asks for while an identity switch is in flight waits for it, then runs once (#22, item 5).

This process runs ``switch_identity`` with the simulated host's ``switch_model`` held open; a second, real process
(``loopd-es owner nudge`` / ``owner send``) asks for a turn meanwhile on an interactive goal (whose explicit turn
nothing else would ever start). The CLI says the turn is queued; when the switch lands, the switching process
runs the queued turn, with the new identity, exactly once.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from loopd_es.app.service import Ctx
from loopd_es.log import open_store
from tests.waits import scaled_timeout

from .test_switch_turn_race import NEW, OLD, _cli, _prompts, held

pytestmark = pytest.mark.anyio


async def _types(store_path: Path, goal_id: str) -> list[str]:
    async with await open_store(f"sqlite:{store_path}", create=False) as store:
        return [e.type async for e in store.read_stream(f"goal-{goal_id}")]


@pytest.mark.parametrize(
    ("verb", "said"),
    [
        (("nudge",), 'Turn queued for "held": an identity switch is being applied'),
        (
            ("send", "use pnpm"),
            'Queued for "held" (an identity switch is being applied; delivers as its own turn',
        ),
    ],
)
async def test_an_owner_turn_during_a_switch_is_queued_and_runs_once_with_the_new_identity(
    tmp_path: Path, verb: tuple[str, ...], said: str
) -> None:
    code, out, err = await _cli(
        tmp_path, "goal", "create", "held", "--objective", "o", "--model", OLD, "--interactive", "--read-only"
    )
    assert code == 0, err
    goal_id = out.splitlines()[0]
    code, _, err = await _cli(tmp_path, "sim", "reply", goal_id)  # the worker answers the first turn
    assert code == 0, err
    code, _, err = await _cli(tmp_path, "goal", "idle", goal_id)  # the first turn is over
    assert code == 0, err

    store, host, goals, session = await held(tmp_path, goal_id)
    before = await _prompts(tmp_path, session)
    try:
        async with anyio.create_task_group() as tg:

            async def switch() -> None:
                await goals.switch_identity(goal_id, Ctx.new(), model=NEW)

            tg.start_soon(switch)
            with anyio.fail_after(scaled_timeout(30)):
                await host.wait_held("switch_model")
            code, out, err = await _cli(tmp_path, "owner", *verb[:1], goal_id, *verb[1:])
            assert code == 0 and said in out, (out, err)
            assert "Re-prompted" not in out and "as its own turn." not in out
            assert await _prompts(tmp_path, session) == before  # nothing prompted with the old model
            await host.release("switch_model")
        goals.service.forget(goal_id)
        state = await goals.service.load(goal_id)
    finally:
        await store.aclose()
    assert state.config.model == NEW and state.turn_requested is None
    assert await _prompts(tmp_path, session) == [*before, NEW]  # the queued turn, once, on the new model
    types = await _types(tmp_path / "events.db", goal_id)
    after_request = types[types.index("goal.turn_requested") :]
    assert after_request.count("run.started") == 1 and "identity.switch_applied" in after_request
    # nothing is left to run: recovery and a second look find no queued turn
    code, out, err = await _cli(tmp_path, "goal", "recover")
    assert code == 0, err
    assert await _prompts(tmp_path, session) == [*before, NEW]


async def test_a_turn_asked_for_during_a_held_switch_runs_once_after_it_all_from_the_cli(
    tmp_path: Path,
) -> None:
    """The same race with nothing in this process: ``loopd-es host hold switch_model`` stops the switch of a
    ``goal switch-identity`` process at its host call, ``owner nudge`` asks for a turn meanwhile, and
    ``host release`` lets the switch land; the queued turn then runs once, on the new model."""
    code, out, err = await _cli(
        tmp_path, "goal", "create", "held", "--objective", "o", "--model", OLD, "--interactive", "--read-only"
    )
    assert code == 0, err
    goal_id = out.splitlines()[0]
    for step in (("sim", "reply", goal_id), ("goal", "idle", goal_id), ("host", "hold", "switch_model")):
        code, _, err = await _cli(tmp_path, *step)
        assert code == 0, err
    session = (await _cli(tmp_path, "goal", "show", goal_id, "--json"))[1]
    worker = json.loads(session)["goal"]["worker_session_id"]
    before = await _prompts(tmp_path, worker)
    switched: list[tuple[int, str, str]] = []
    async with anyio.create_task_group() as tg:

        async def switch() -> None:
            switched.append(await _cli(tmp_path, "goal", "switch-identity", goal_id, "--model", NEW))

        tg.start_soon(switch)
        code, out, err = await _cli(tmp_path, "host", "held", "--wait", "switch_model", "--json")
        assert code == 0, err
        assert [h["op"] for h in json.loads(out)["held"]] == ["switch_model"]
        code, out, err = await _cli(tmp_path, "owner", "nudge", goal_id)
        assert code == 0 and 'Turn queued for "held": an identity switch is being applied' in out, (out, err)
        assert await _prompts(tmp_path, worker) == before  # nothing prompted with the old model
        code, out, err = await _cli(tmp_path, "host", "release", "switch_model")
        assert code == 0 and "1 call(s) go on" in out, (out, err)
    code, out, err = switched[0]
    assert code == 0, err
    assert await _prompts(tmp_path, worker) == [*before, NEW]  # the queued turn, once, on the new model
    types = await _types(tmp_path / "events.db", goal_id)
    after_request = types[types.index("goal.turn_requested") :]
    assert after_request.count("run.started") == 1 and "identity.switch_applied" in after_request
