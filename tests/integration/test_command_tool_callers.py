"""The command tools record who called them and read only their validated arguments (issue #22, leftovers).

Real processes in real PTYs, through the dispatcher as OpenCode's tool files call it: every change a
``loopd_command_*`` call makes carries the calling session, message and call ids (``called_by``), the fold and
the ``commands`` read model say who started and who last acted on the command, and a value of the right JSON
type that the reference's own checks refuse is answered in one line, never coerced.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import msgspec
import pytest

from loopd_es.domain.command import fold
from loopd_es.engine.operations import Operations
from loopd_es.engine.tool_api import ToolCall
from loopd_es.events.catalogue import decode_payload
from loopd_es.events.command import CommandStarted, command_stream
from loopd_es.postmortem.who import who_lines
from loopd_es.procs import service

from .test_command_tools import ECHO, SLEEPER, Tools, tools
from .test_procs_support import PY, Env, env, store

if TYPE_CHECKING:
    from loopd_es.log.base import LogStore

pytestmark = pytest.mark.anyio
__all__ = ["env", "store", "tools"]


def _by(call: str) -> dict[str, Any]:
    return {"role": "owner", "session_id": "ses_a", "tool": "", "message_id": f"msg_{call}", "call_id": call}


async def _call(tools: Tools, tool: str, call: str, **args: Any) -> dict[str, Any]:
    """``tool`` called by ``ses_a`` as OpenCode's tool file forwards it, with message and call ids."""
    context = {
        "directory": str(tools.env.tmp),
        "sessionID": "ses_a",
        "messageID": f"msg_{call}",
        "callID": call,
    }
    answer = await tools.dispatcher.call(ToolCall(tool=tool, args=args, context=context))
    json.dumps(answer)
    return answer


async def _events(store: LogStore, cid: str) -> list[tuple[str, dict[str, Any]]]:
    return [(e.type, e.data_dict()) async for e in store.read_stream(command_stream(cid))]


async def test_every_change_a_command_tool_makes_records_its_call(tools: Tools, env: Env) -> None:
    started = await _call(tools, "loopd_command_start", "c1", title="echo", command=PY, args=["-c", ECHO])
    assert started["ok"], started
    cid = started["command_id"]
    await env.state(tools.store, cid)
    await tools.output_until(cid, lambda out: "ready" in out)
    assert (await _call(tools, "loopd_command_write", "c2", command_id=cid, input="hi\n"))["ok"]
    assert (await _call(tools, "loopd_command_resize", "c3", command_id=cid, cols=100, rows=30))["ok"]
    assert (await _call(tools, "loopd_command_watch", "c4", command_id=cid, watch_filter="got"))["ok"]
    assert (await _call(tools, "loopd_command_watch", "c5", command_id=cid, clear=True))["ok"]
    assert (await _call(tools, "loopd_command_interrupt", "c6", command_id=cid))["ok"]
    terminated = await _call(tools, "loopd_command_terminate", "c7", command_id=cid)
    assert terminated["ok"], terminated
    assert (await _call(tools, "loopd_command_remove", "c8", command_id=cid))["ok"]

    recorded = {(t, (d.get("called_by") or {}).get("call_id")) for t, d in await _events(tools.store, cid)}
    for fact in (
        ("command.started", "c1"),
        ("command.input-written", "c2"),
        ("command.resized", "c3"),
        ("command.watch-set", "c4"),
        ("command.watch-suspended", "c5"),
        ("command.signal-sent", "c6"),
        ("command.signal-sent", "c7"),
        ("command.removed", "c8"),
    ):
        assert fact in recorded, (fact, sorted(recorded, key=str))
    assert ("command.exited", None) in recorded  # the process's own end: a fact nobody called
    started_by = next(d["called_by"] for t, d in await _events(tools.store, cid) if t == "command.started")
    assert started_by == _by("c1") | {"tool": "loopd_command_start"}

    state = fold([decode_payload(e) async for e in tools.store.read_stream(command_stream(cid))])
    assert state is not None and state.started_by is not None and state.controlled_by is not None
    assert (state.started_by.call_id, state.controlled_by.call_id) == ("c1", "c8")
    assert state.controlled_by.tool == "loopd_command_remove"

    listed = _cli(env, "commands", "--all", "--json")
    row = next(r for r in json.loads(listed)["commands"] if r["command_id"] == cid)
    assert row["started_by"] == started_by
    assert row["controlled_by"]["call_id"] == "c8"
    assert who_lines(row) == [
        "started by owner session ses_a (call c1) with loopd_command_start, message msg_c1",
        "last changed by owner session ses_a (call c8) with loopd_command_remove, message msg_c8",
    ]


async def test_an_await_records_the_call_that_asked_for_it(tools: Tools, env: Env) -> None:
    ops = Operations(tools.store, tools.host, clock=tools.clock, directory=str(env.tmp), owner="ses_a")
    created = await ops.create("g", "o", workspace_write=False)
    assert created.goal_id is not None
    started = await _call(tools, "loopd_command_start", "c1", title="srv", command=PY, args=["-c", SLEEPER],
                          goal_id=created.goal_id)  # fmt: skip
    assert started["ok"], started
    cid = started["command_id"]
    await env.state(tools.store, cid)
    answer = await _call(tools, "loopd_command_await", "c9", command_id=cid, goal_id=created.goal_id)
    assert answer["ok"], answer
    asked = [d for t, d in await _events(tools.store, cid) if t == "command.await-requested"]
    assert asked and asked[0]["called_by"]["call_id"] == "c9"
    state = await service.load_state(tools.store, cid)
    assert state is not None and state.awaits[0].requested_by is not None
    assert state.awaits[0].requested_by.tool == "loopd_command_await"
    history = _cli(env, "history", created.goal_id)  # the goal's timeline includes its commands
    assert "started by owner session ses_a (call c1) with loopd_command_start, message msg_c1" in history
    assert "await requested by owner session ses_a (call c9) with loopd_command_await" in history, history


async def test_a_command_of_the_cli_and_an_old_log_record_no_caller(tools: Tools, env: Env) -> None:
    cid = await env.start(tools.store, "plain", PY, "-c", SLEEPER)
    state = await env.state(tools.store, cid)
    assert state.started_by is None and state.controlled_by is None
    old = b'{"command_id":"c","title":"t","command":"true","cwd":"/","started_at":"2026-01-01T00:00:00.000000Z"}'
    assert msgspec.json.decode(old, type=CommandStarted).called_by is None  # a log before 0.5 still reads


@pytest.mark.parametrize(
    ("tool", "args", "message"),
    [
        ("loopd_command_start", {"cols": 80.5}, "Invalid size 80.5x24: cols and rows must be positive integers."),
        ("loopd_command_start", {"rows": 0}, "Invalid size 80x0: cols and rows must be positive integers."),
        ("loopd_command_start", {"cols": -3}, "Invalid size -3x24: cols and rows must be positive integers."),
        ("loopd_command_start", {"timeout_seconds": 1.5}, "timeoutSeconds must be a positive integer in seconds"),
        ("loopd_command_start", {"timeout_seconds": 0}, "timeoutSeconds must be a positive integer in seconds"),
        ("loopd_command_start", {"watch_until_action": "later"},
         'Invalid watch_until_action \'later\': must be "stop" or "keep".'),
        ("loopd_command_start", {"goal_id": "../etc"}, "goal"),
        ("loopd_command_get", {"offset_bytes": -1}, "offset_bytes must be a non-negative integer"),
        ("loopd_command_get", {"offset_bytes": 2.5}, "offset_bytes must be a non-negative integer"),
        ("loopd_command_get", {"limit_bytes": 0.5}, "limit_bytes must be a non-negative integer"),
        ("loopd_command_resize", {"cols": 0, "rows": 10}, "Invalid size 0x10: cols and rows must be positive integers."),
        ("loopd_command_resize", {"cols": 10, "rows": 2.5}, "Invalid size 10x2.5: cols and rows must be positive integers."),
        ("loopd_command_write", {"command_id": "../x", "input": "a"}, "Command not found."),
        ("loopd_command_await", {"goal_id": "nope/../x"}, "Goal not found."),
    ],
)  # fmt: skip
async def test_a_value_the_reference_refuses_is_one_line_never_coerced(
    tools: Tools, tool: str, args: dict[str, Any], message: str
) -> None:
    base: dict[str, Any] = {"title": "t", "command": PY} if tool == "loopd_command_start" else {}
    if tool in ("loopd_command_get", "loopd_command_resize", "loopd_command_await"):
        base["command_id"] = await tools.start("srv", "-c", SLEEPER)
    before = len(await service.list_states(tools.store))
    answer = await tools(tool, **(base | args))
    assert answer["ok"] is False and message in answer["message"], answer
    assert "\n" not in answer["message"] and "internal error" not in answer["message"], answer
    assert len(await service.list_states(tools.store)) == before  # nothing started


async def test_the_handlers_keep_the_values_as_given(tools: Tools) -> None:
    """``false`` stays false (not "absent"), ``100.0`` is the integer 100, lists and maps arrive whole."""
    answer = await tools(
        "loopd_command_start", title="kept", command=PY, args=["-c", SLEEPER], notify_on_exit=False,
        shell=False, cols=100.0, rows=40, env={"LOOPD_T": "1"}, timeout_seconds=600.0,
    )  # fmt: skip
    assert answer["ok"], answer
    state = await tools.env.state(tools.store, answer["command_id"])
    assert state.notify_on_exit is False and state.shell is False
    assert (state.cols, state.rows, state.timeout_seconds) == (100, 40, 600)
    assert type(state.cols) is int and type(state.timeout_seconds) is int
    assert state.args == ("-c", SLEEPER) and state.env_keys == ("LOOPD_T",)


def _cli(env: Env, *args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "loopd_es", "--store", env.url, *args],
        cwd=env.tmp, capture_output=True, text=True, timeout=60,
        env={**os.environ, "LOOPD_ES_STORE": env.url},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout
