"""Holds: the in-process hold point, the simulated host's holds in its state, and ``loopd-es host ...``."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from loopd_es.cli.main import main
from loopd_es.host import HostConfigError, open_host
from loopd_es.host.holds import Holds
from loopd_es.host.simulated import SimulatedHost

pytestmark = pytest.mark.anyio


async def test_a_hold_stops_its_call_until_released_and_lets_others_by() -> None:
    holds = Holds("prompt")
    passed: list[str] = []

    async def call(name: str) -> None:
        await holds.enter(name)
        passed.append(name)

    async with anyio.create_task_group() as tg:
        tg.start_soon(call, "prompt")
        tg.start_soon(call, "prompt")
        with anyio.fail_after(5):
            await holds.wait_held("prompt", count=2)
        await call("abort")  # not held
        assert passed == ["abort"] and holds.held("prompt") == 2
        holds.release("prompt")
    assert passed == ["abort", "prompt", "prompt"] and holds.held("prompt") == 0
    await call("prompt")  # released: no longer held
    with pytest.raises(HostConfigError, match="cannot hold 'nope'"):
        holds.hold("nope")


async def test_a_held_call_in_a_file_state_waits_and_a_cancelled_one_never_happens(tmp_path: Path) -> None:
    script = tmp_path / "host.json"
    host = SimulatedHost.from_file(script)
    other = SimulatedHost.from_file(script)  # another process, as far as the state file is concerned
    made = await host.create_worker(title="w")
    await other.hold("abort")
    with anyio.move_on_after(0.3):  # held: the abort does not happen, and its ticket is given back
        await host.abort(made.session_id)
    assert (await other.held()) == (["abort"], [])
    assert not await host.journal("abort")
    async with anyio.create_task_group() as tg:
        tg.start_soon(host.abort, made.session_id)
        with anyio.fail_after(5):
            waiting = await other.wait_held("abort")
        assert [(h.op, h.session_id) for h in waiting] == [("abort", made.session_id)]
        assert [h.ticket for h in await other.release("abort")] == [waiting[0].ticket]
    assert [c.outcome for c in await host.journal("abort")] == ["ok"]


async def test_a_sim_url_can_hold_calls_and_refuses_other_options(tmp_path: Path) -> None:
    host = await open_host(f"sim:{tmp_path / 'host.json'}?hold=prompt,switch_model&hold=notify")
    assert isinstance(host, SimulatedHost)
    assert (await host.held())[0] == ["prompt", "switch_model", "notify"]
    with pytest.raises(HostConfigError, match="unknown option 'x'"):
        await open_host(f"sim:{tmp_path / 'host.json'}?x=1")
    with pytest.raises(HostConfigError, match="cannot hold 'nope'"):
        await open_host(f"sim:{tmp_path / 'host.json'}?hold=nope")


def test_the_host_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    host = ["--host", f"sim:{tmp_path / 'host.json'}"]
    assert main("host", "hold", "prompt", "abort", *host) == 0
    assert capsys.readouterr().out == "holding prompt, abort\n"
    assert main("host", "held", "--json", *host) == 0
    assert json.loads(capsys.readouterr().out) == {"holds": ["prompt", "abort"], "held": []}
    assert main("host", "held", "--wait", "prompt", "--timeout", "0.2", *host) == 3
    assert "fewer than 1 prompt call(s) held after 0.2 s" in capsys.readouterr().err
    assert main("host", "hold", "nope", *host) == 2
    assert "cannot hold 'nope'" in capsys.readouterr().err
    assert main("host", "held", "--count", "0", *host) == 2
    capsys.readouterr()
    assert main("host", "release", *host) == 0
    assert capsys.readouterr().out == "released every call: 0 call(s) go on\n"
    assert main("host", "held", *host) == 0
    assert capsys.readouterr().out == "holds: none\n"
    assert main("host", "held", "--host", "opencode:http://127.0.0.1:9") == 2
    assert "holds the simulated host's calls only" in capsys.readouterr().err
