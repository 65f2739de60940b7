"""The ``loopd_command_*`` tools at the dispatcher (docs/reference/loopd.md#s3-17, #s3-18): real processes in
real PTYs.

Each call goes through :class:`ToolDispatcher` as a call from OpenCode's tool file would (arguments plus the
calling session's context), so the session check, the ownership rule, the validation messages and the answers
are the ones a model sees.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import pytest

from loopd_es.clock import FakeClock
from loopd_es.engine.command_tools import COMMAND_TOOLS, NO_SESSION
from loopd_es.engine.operations import Operations
from loopd_es.engine.tool_api import ToolCall, ToolDispatcher, hidden_from_workers
from loopd_es.host import SimulatedHost
from loopd_es.host.sim_script import HostScript
from loopd_es.procs import service
from tests.waits import await_until

from .test_procs_support import PY, Env, env, store

pytestmark = pytest.mark.anyio
__all__ = ["env", "store"]

ECHO = (
    "import signal, sys\n"
    "signal.signal(signal.SIGINT, lambda *a: print('interrupted', flush=True))\n"
    "print('ready', flush=True)\n"
    "for line in sys.stdin:\n"
    "    print('got ' + line.strip(), flush=True)\n"
)
SLEEPER = "import time\nprint('ready', flush=True)\ntime.sleep(60)\n"


class Tools:
    """A dispatcher over the test's store, as the engine builds it, and a way to call it as a session."""

    def __init__(self, env: Env, store: Any) -> None:
        self.env = env
        self.store = store
        self.project = os.path.realpath(env.tmp)  # where a start without cwd runs (the calling directory)
        self.clock = FakeClock()
        self.host = SimulatedHost(HostScript(), clock=self.clock)
        self.dispatcher = ToolDispatcher(store, self.host, self.clock, str(env.tmp), store_url=env.url)

    async def __call__(self, tool: str, session: str | None = "ses_a", **args: Any) -> dict[str, Any]:
        context = {"directory": str(self.env.tmp), "callID": "call_1"}
        if session is not None:
            context["sessionID"] = session
        answer = await self.dispatcher.call(ToolCall(tool=tool, args=args, context=context))
        json.dumps(answer)  # what goes back to OpenCode must be JSON
        return answer

    async def start(self, title: str, *argv: str, session: str = "ses_a", **args: Any) -> str:
        answer = await self("loopd_command_start", session, title=title, command=PY, args=list(argv), **args)
        assert answer["ok"], answer
        cid = str(answer["command_id"])
        await self.env.state(self.store, cid)  # its pids are killed after the test
        return cid

    async def output_until(
        self, cid: str, check: Callable[[str], bool], session: str = "ses_a", within: float = 30
    ) -> dict[str, Any]:
        return await await_until(
            f"command {cid}'s output to match",
            lambda: self("loopd_command_get", session, command_id=cid),
            done=lambda answer: bool(answer["ok"]) and check(answer["output"]),
            within=within,
        )


@pytest.fixture
def tools(env: Env, store: Any) -> Tools:
    return Tools(env, store)


async def test_every_command_tool_refuses_a_call_without_a_session(tools: Tools) -> None:
    for spec in COMMAND_TOOLS:
        for session in (None, ""):  # "main" is a session: the service refuses it as an owner
            answer = await tools(spec.name, session, command_id="x", title="t", command=PY)
            assert answer == {"ok": False, "errorCode": "no_session", "message": NO_SESSION}, spec.name
    assert await service.list_states(tools.store) == []


async def test_start_validates_everything_before_spawning(tools: Tools) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"watch_until_action": "bogus"}, 'Invalid watch_until_action \'bogus\': must be "stop" or "keep".'),
        ({"title": "  "}, "title is required"),
        ({"command": ""}, "command is required"),
        ({"timeout_seconds": 0}, "timeoutSeconds must be a positive integer in seconds"),
        ({"timeout_seconds": -5}, "timeoutSeconds must be a positive integer in seconds"),
        ({"timeout_seconds": 1.5}, "timeoutSeconds must be a positive integer in seconds"),
        ({"watch_filter": "(unclosed"}, "Invalid watch filter regex '(unclosed'"),
        (
            {"watch_until": "(a+)+"},
            "Potentially dangerous watch until regex rejected: '(a+)+'. Please use a safer pattern.",
        ),
        ({"cols": 0}, "Invalid size 0x24: cols and rows must be positive integers."),
        ({"command": "no-such-program-xyz"}, "was not found or is not executable"),
    ]
    for extra, message in cases:
        args = {"title": "t", "command": PY, "args": ["-c", "print(1)"], **extra}
        answer = await tools("loopd_command_start", **args)
        assert answer["ok"] is False and message in answer["message"], (extra, answer)
    answer = await tools("loopd_command_start", command=PY)
    assert answer == {"ok": False, "message": "Missing required argument(s): title."}
    assert await service.list_states(tools.store) == []  # nothing recorded
    root = tools.env.paths.root
    assert not root.exists() or not list(root.glob("*.log"))  # nothing spawned


async def test_a_real_process_started_read_written_interrupted_terminated_removed(tools: Tools) -> None:
    started = await tools("loopd_command_start", title="echo", command=PY, args=["-c", ECHO])
    assert started["ok"] and started["message"].startswith('Command "echo" started as ')
    cid = started["command_id"]
    assert started["command"]["ownerSessionID"] == "ses_a" and started["command"]["status"] == "running"
    await tools.env.state(tools.store, cid)
    first = [e async for e in tools.store.read_stream(f"command-{cid}")][0]
    assert first.type == "command.started" and first.data_dict()["owner_session_id"] == "ses_a"

    got = await tools.output_until(cid, lambda out: "ready" in out)
    assert got["live"] is True and got["command"]["status"] == "running"

    assert await tools("loopd_command_write", command_id=cid, input="hello\n") == {
        "ok": True,
        "message": 'Sent 6 byte(s) to "echo".',
    }
    await tools.output_until(cid, lambda out: "got hello" in out)
    matches = await tools("loopd_command_get", command_id=cid, pattern="^got")
    assert (
        matches["totalMatches"] == 1 and "got hello" in matches["output"] and "ready" not in matches["output"]
    )

    interrupted = await tools("loopd_command_interrupt", command_id=cid)
    assert (
        interrupted["message"] == 'SIGINT delivered to "echo" (process may continue if it traps the signal).'
    )
    await tools.output_until(cid, lambda out: "interrupted" in out)

    refused = await tools("loopd_command_remove", command_id=cid)
    assert refused == {
        "ok": False,
        "message": 'Command "echo" is still running — terminate it first (terminate ≠ remove).',
    }
    terminated = await tools("loopd_command_terminate", command_id=cid)
    assert terminated == {
        "ok": True,
        "message": 'Command "echo" terminated.',
        "removed": False,
        "status": "terminated",
    }
    after = await tools("loopd_command_get", command_id=cid)
    assert after["live"] is False and after["command"]["endReason"] == "terminate"
    assert "got hello" in after["output"]  # the output outlives the process
    assert (await tools("loopd_command_write", command_id=cid, input="x"))["message"] == (
        "Command is terminated; only running commands accept input."
    )
    assert (await tools("loopd_command_interrupt", command_id=cid))["message"] == (
        "Command is terminated; nothing to interrupt."
    )
    assert (await tools("loopd_command_terminate", command_id=cid))["message"] == (
        "Command is terminated; nothing to terminate."
    )
    assert await tools("loopd_command_remove", command_id=cid) == {
        "ok": True,
        "message": 'Command "echo" removed.',
        "removed": True,
    }
    assert await tools("loopd_command_get", command_id=cid) == {
        "ok": False,
        "message": "Command not found for this session.",
    }


async def test_another_sessions_command_is_not_found(tools: Tools) -> None:
    cid = await tools.start("mine", "-c", SLEEPER, session="ses_a")
    assert (await tools("loopd_command_get", "ses_b", command_id=cid))["message"] == (
        "Command not found for this session."
    )
    for tool, extra in (
        ("loopd_command_write", {"input": "x\n"}),
        ("loopd_command_interrupt", {}),
        ("loopd_command_terminate", {"remove": True}),
        ("loopd_command_remove", {}),
        ("loopd_command_resize", {"cols": 90, "rows": 30}),
        ("loopd_command_watch", {"watch_filter": "x"}),
    ):
        answer = await tools(tool, "ses_b", command_id=cid, **extra)
        assert answer == {"ok": False, "message": "Command not found."}, tool
        prefix = await tools(tool, "ses_b", command_id=cid[:8], **extra)  # nor by its short id
        assert prefix == {"ok": False, "message": "Command not found."}, tool
    state = await tools.env.state(tools.store, cid)
    assert state.running and state.input_bytes == 0 and state.signal is None  # untouched

    # a command started from the CLI has no owner session: no OpenCode session may touch it
    cli_cid = await tools.env.start(tools.store, "-c", SLEEPER, title="from the cli")
    assert (await tools("loopd_command_terminate", "ses_a", command_id=cli_cid))[
        "message"
    ] == "Command not found."
    # the owner may use the short id its start message showed
    assert (await tools("loopd_command_terminate", "ses_a", command_id=cid[:8]))["message"] == (
        'Command "mine" terminated.'
    )
    for bad in ("", "../x", "no-such-command"):
        assert (await tools("loopd_command_write", command_id=bad, input="x"))[
            "message"
        ] == "Command not found."


async def test_resize_watch_and_terminate_with_remove(tools: Tools) -> None:
    cid = await tools.start("srv", "-c", SLEEPER)
    assert (await tools("loopd_command_resize", command_id=cid, cols=0, rows=10))["message"] == (
        "Invalid size 0x10: cols and rows must be positive integers."
    )
    assert (await tools("loopd_command_resize", command_id=cid, cols=1.5, rows=10))["message"] == (
        "Invalid size 1.5x10: cols and rows must be positive integers."
    )
    assert await tools("loopd_command_resize", command_id=cid, cols=100, rows=30) == {
        "ok": True,
        "message": 'Terminal resized to 100x30 for "srv".',
    }
    assert (await tools.env.state(tools.store, cid)).cols == 100

    bad_action = await tools(
        "loopd_command_watch", command_id=cid, watch_until="READY", watch_until_action="x"
    )
    assert bad_action["message"] == 'Invalid watch untilAction \'x\': must be "stop" or "keep".'
    bad_regex = await tools("loopd_command_watch", command_id=cid, watch_filter="(a+)+")
    assert bad_regex["message"].startswith("Potentially dangerous watch filter regex rejected")
    assert (await tools.env.state(tools.store, cid)).watch is None  # the failed calls changed nothing
    watched = await tools(
        "loopd_command_watch",
        command_id=cid,
        watch_filter="ERROR",
        watch_until="READY",
        watch_until_action="keep",
    )
    assert watched["message"] == (
        'Watch set for "srv" (filter="ERROR"  until="READY"  action=keep; counters reset to active).'
    )
    state = await tools.env.state(tools.store, cid)
    assert state.watch is not None and state.watch.until_action == "keep"
    assert (await tools("loopd_command_watch", command_id=cid, clear=True))[
        "message"
    ] == 'Watch cleared for "srv".'
    assert (await tools.env.state(tools.store, cid)).watch is None

    done = await tools("loopd_command_terminate", command_id=cid, remove=True)
    assert done == {"ok": True, "message": 'Command "srv" terminated; removed.', "removed": True}
    assert (await tools("loopd_command_get", command_id=cid))["ok"] is False
    assert (await tools.env.state(tools.store, cid)).removed


async def test_pattern_reads_page_through_matches_and_refuse_bad_patterns(tools: Tools) -> None:
    body = "print('\\x1b[31mERROR boom\\x1b[0m'); print('match one'); print('nope'); print('match two'); print('match three')"
    cid = await tools.start("lines", "-c", body)
    await tools.env.until(tools.store, cid, lambda s: not s.running)
    page = await tools("loopd_command_get", command_id=cid, pattern="^match", offset_bytes=1, limit_bytes=2)
    assert page["totalMatches"] == 3 and page["output"].splitlines() == ["match two", "match three"]
    ansi = await tools("loopd_command_get", command_id=cid, pattern="ERROR")
    assert ansi["totalMatches"] == 1 and "\x1b[31m" in ansi["output"]  # the original line, colours and all
    assert (await tools("loopd_command_get", command_id=cid, pattern="error"))["totalMatches"] == 0
    assert (await tools("loopd_command_get", command_id=cid, pattern="error", ignore_case=True))[
        "totalMatches"
    ] == 1
    assert (await tools("loopd_command_get", command_id=cid, pattern="("))["message"].startswith(
        "Invalid regex pattern '('"
    )
    assert (await tools("loopd_command_get", command_id=cid, pattern="(a+)+"))["message"] == (
        "Potentially dangerous regex pattern rejected: '(a+)+'. Please use a safer pattern."
    )
    plain = await tools("loopd_command_get", command_id=cid, offset_bytes=0, limit_bytes=5)
    assert plain["offset"] == 0 and plain["next_offset"] == 5 and plain["live"] is False


async def test_env_values_reach_the_process_and_never_the_log_and_cwd_is_the_project(tools: Tools) -> None:
    cid = await tools.start(
        "env",
        "-c",
        "import os; print(os.environ['SECRET_TOKEN'], os.getcwd())",
        env={"SECRET_TOKEN": "s3cr3t"},
    )
    await tools.env.until(tools.store, cid, lambda s: not s.running)
    got = await tools("loopd_command_get", command_id=cid)
    assert "s3cr3t" in got["output"] and tools.project in got["output"]
    assert got["command"]["envKeys"] == ["SECRET_TOKEN"]
    events = [e.data_dict() async for e in tools.store.read_stream(f"command-{cid}")]
    assert "s3cr3t" not in json.dumps(events)

    sh = await tools("loopd_command_start", title="sh", command="echo", args=["hi there", "a|b"], shell=True)
    assert sh["ok"]
    await tools.env.state(tools.store, sh["command_id"])
    done = await tools.output_until(sh["command_id"], lambda out: "hi there a|b" in out)
    assert done["command"]["command"] == "echo" and done["command"]["shell"] is True


async def test_await_checks_both_owners_and_wakes_the_goal(tools: Tools) -> None:
    ops = Operations(tools.store, tools.host, clock=tools.clock, directory=str(tools.env.tmp), owner="ses_a")
    goal = await ops.create("guide", "write the guide", workspace_write=False)
    assert goal.goal_id is not None
    other = Operations(
        tools.store, tools.host, clock=tools.clock, directory=str(tools.env.tmp), owner="ses_b"
    )
    theirs = await other.create("theirs", "other work", workspace_write=False)
    assert theirs.goal_id is not None

    cid = await tools.start("build", "-c", SLEEPER)
    assert (await tools("loopd_command_await", command_id=cid, goal_id="no-such-goal"))[
        "message"
    ] == "Goal not found."
    assert (await tools("loopd_command_await", command_id="nope", goal_id=goal.goal_id))["message"] == (
        "Command not found."
    )
    assert (await tools("loopd_command_await", command_id=cid, goal_id=theirs.goal_id))["message"] == (
        "Owner mismatch: goal and command are owned by different sessions."
    )
    assert (await tools("loopd_command_await", "ses_b", command_id=cid, goal_id=goal.goal_id))["message"] == (
        "Owner mismatch: the await requester must own both the goal and the command."
    )
    assert (await tools("loopd_command_await", command_id=cid, goal_id=goal.goal_id, until=""))[
        "message"
    ] == ("Await 'until' must be a non-empty regex.")
    waiting = await tools("loopd_command_await", command_id=cid, goal_id=goal.goal_id)
    assert waiting == {"ok": True, "message": 'Goal "guide" now awaits "build" (fires once on exit).'}
    state = await tools.env.state(tools.store, cid)
    assert [a.goal_id for a in state.awaits] == [goal.goal_id]
    requested = [
        e async for e in tools.store.read_stream(f"command-{cid}") if e.type == "command.await-requested"
    ]
    assert requested[0].data_dict()["owner_session_id"] == "ses_a"

    await tools("loopd_command_terminate", command_id=cid)
    fired = [e async for e in tools.store.read_stream(f"command-{cid}") if e.type == "command.await-fired"]
    assert len(fired) == 1 and fired[0].data_dict()["goal_id"] == goal.goal_id

    quick = await tools.start("quick", "-c", "print('done')")
    await tools.env.until(tools.store, quick, lambda s: not s.running)
    now = await tools("loopd_command_await", command_id=quick, goal_id=goal.goal_id)
    assert now == {
        "ok": True,
        "message": 'Command "quick" already exited; wake-up delivered to goal "guide".',
        "fired": True,
        "active": True,
    }


def test_command_tools_are_owner_tools_hidden_from_workers() -> None:
    hidden = hidden_from_workers()
    for spec in COMMAND_TOOLS:
        assert spec.role == "owner" and hidden[spec.name] is False
