"""The command tools follow the reference's rules where they had drifted (docs/reference/loopd.md#s3-17): the
start checks and their order, JavaScript's trim, the owner "main", bad environments refused before spawning."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from loopd_es.engine.command_tools import NO_SESSION
from loopd_es.procs import service
from tests.waits import await_until

from .test_command_tools import SLEEPER, Tools, tools
from .test_procs_support import PY, env, store

pytestmark = pytest.mark.anyio
__all__ = ["env", "store", "tools"]

OWNER = "A valid owner session is required. Run from an active OpenCode session."


async def _nothing_recorded(tools: Tools) -> None:
    assert await service.list_states(tools.store) == []
    root = tools.env.paths.root
    assert not root.exists() or not list(root.glob("*.log"))  # nothing spawned


@pytest.mark.parametrize(
    ("environment", "message"),
    [
        ({"A=B": "x"}, "Invalid env name 'A=B': a name must be non-empty, without '=' or a NUL byte."),
        ({"": "x"}, "Invalid env name '': a name must be non-empty, without '=' or a NUL byte."),
    ],
)
async def test_an_environment_exec_cannot_take_is_refused_before_spawning(
    tools: Tools, environment: dict[str, str], message: str
) -> None:
    """Accepted before (ok:true), then the record ended exit 1 with the owner's own traceback as output."""
    answer = await tools("loopd_command_start", title="t", command="true", env=environment)
    assert answer == {"ok": False, "message": message}
    await _nothing_recorded(tools)


@pytest.mark.parametrize("environment", [{"A\0": "x"}, {"A": "x\0"}])
async def test_a_nul_in_the_environment_is_refused_with_the_arguments(
    tools: Tools, environment: dict[str, str]
) -> None:
    answer = await tools("loopd_command_start", title="t", command="true", env=environment)
    assert answer["ok"] is False and "NUL" in answer["message"] and "$.env" in answer["message"]
    await _nothing_recorded(tools)


async def test_main_is_refused_as_an_owner_by_the_service_not_as_no_session(tools: Tools) -> None:
    answer = await tools("loopd_command_start", "main", title="t", command=PY)
    assert answer == {"ok": False, "message": OWNER}
    # the checks before the owner's still come first
    assert (await tools("loopd_command_start", "main", title=" ", command=PY))[
        "message"
    ] == "title is required"
    assert (await tools("loopd_command_get", "main", command_id="abcd"))["message"] == (
        "Command not found for this session."
    )
    for session in (None, ""):
        answer = await tools("loopd_command_start", session, title="t", command=PY)
        assert answer == {"ok": False, "errorCode": "no_session", "message": NO_SESSION}
    await _nothing_recorded(tools)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"title": "", "cols": 0}, "title is required"),
        ({"title": "", "goal_id": "../bad"}, "title is required"),
        ({"command": " ", "cols": 0, "goal_id": "../bad"}, "command is required"),
        ({"timeout_seconds": 1.5, "cols": 0}, "timeoutSeconds must be a positive integer in seconds"),
        ({"watch_filter": "(", "cols": 0, "goal_id": "../bad"}, "Invalid watch filter regex '('"),
        ({"title": "", "watch_until_action": "x"}, "Invalid watch_until_action 'x'"),
    ],
)
async def test_start_checks_in_the_reference_order(tools: Tools, extra: dict[str, Any], message: str) -> None:
    """After the tool's action check: title, command, owner, timeout, watch regex; a size or a goal id after."""
    answer = await tools("loopd_command_start", **{"title": "t", "command": PY, **extra})
    assert answer["ok"] is False and answer["message"].startswith(message), answer
    await _nothing_recorded(tools)


@pytest.mark.parametrize("blank", ["\ufeff", " \u2028\u3000\t", "\u00a0"])
async def test_a_title_of_javascript_whitespace_is_blank(tools: Tools, blank: str) -> None:
    assert (await tools("loopd_command_start", title=blank, command=PY))["message"] == "title is required"
    assert (await tools("loopd_command_start", title="t", command=blank))["message"] == "command is required"
    await _nothing_recorded(tools)


@pytest.mark.parametrize("kept", ["\x1f", "\x85", "\x1c"])
async def test_a_title_javascript_does_not_trim_is_kept(tools: Tools, kept: str) -> None:
    """Python's ``strip`` took these for whitespace and refused the title as blank; ``trim`` keeps them."""
    cid = await tools.start(f" {kept} ", "-c", SLEEPER)
    assert (await tools.env.state(tools.store, cid)).title == kept
    await tools("loopd_command_terminate", command_id=cid, remove=True)


NOTHING_SET = 'Watch set for "srv" (filter=—  until=—  action=stop; counters reset to active).'


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"watch_ignore_case": True},
        {"watch_until_action": "keep"},
        {"clear": False},
        {"watch_filter": "", "watch_until": ""},
    ],
)
async def test_only_clear_clears_a_watch(tools: Tools, extra: dict[str, Any]) -> None:
    """A call with no filter and no until cleared the watch (``watch-suspended cleared``) yet answered "Watch
    set"; the reference replaces the watch then (counters reset) and clears only on ``clear:true``."""
    cid = await tools.start("srv", "-c", SLEEPER, watch_filter="ERROR")
    answer = await tools("loopd_command_watch", command_id=cid, **extra)
    action = extra.get("watch_until_action", "stop")
    assert answer == {"ok": True, "message": NOTHING_SET.replace("action=stop", f"action={action}")}
    types = await tools.env.types(tools.store, cid)
    assert types[-1] == "command.watch-set" and "command.watch-suspended" not in types
    await tools("loopd_command_terminate", command_id=cid, remove=True)


async def test_clear_checks_the_watch_first_as_the_reference_does(tools: Tools) -> None:
    cid = await tools.start("srv", "-c", SLEEPER, watch_filter="ERROR")
    bad = await tools("loopd_command_watch", command_id=cid, clear=True, watch_until="(")
    assert bad["ok"] is False and bad["message"].startswith("Invalid watch until regex '('")
    bad = await tools("loopd_command_watch", command_id=cid, clear=True, watch_until_action="x")
    assert bad["message"] == 'Invalid watch untilAction \'x\': must be "stop" or "keep".'
    state = await tools.env.state(tools.store, cid)
    assert state.watch is not None and state.watch.filter == "ERROR"  # untouched
    cleared = await tools("loopd_command_watch", command_id=cid, clear=True, watch_filter="x")
    assert cleared == {"ok": True, "message": 'Watch cleared for "srv".'}
    assert (await tools.env.state(tools.store, cid)).watch is None
    await tools("loopd_command_terminate", command_id=cid, remove=True)


FLOOD = (
    "import sys\n"
    "for i in range(2000): print('L%d' % i, flush=True)\n"
    "print('flooded', flush=True)\n"
    "sys.stdin.readline()\n"
)


async def test_replacing_a_watch_resets_its_dropped_lines(tools: Tools) -> None:
    """Reference: a new watch starts at {active, 0 matches, 0 pushes, 0 dropped lines}; the dropped count of a
    flood-suspended watch survived its replacement."""
    cid = await tools.start("flood", "-c", FLOOD, watch_filter="L")
    await tools.env.until(tools.store, cid, lambda s: s.watch_state == "flood-suspended")
    assert (await tools.env.state(tools.store, cid)).watch_dropped_lines > 0
    await tools("loopd_command_watch", command_id=cid, watch_filter="Z")
    state = await tools.env.state(tools.store, cid)
    assert (state.watch_state, state.watch_dropped_lines, state.watch_pushes) == ("active", 0, 0)
    await tools("loopd_command_terminate", command_id=cid, remove=True)


def test_cli_watch_follows_the_same_rule(env: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from loopd_es.cli.main import main

    assert main("--store", env.url, "cmd", "start", "--title", "srv", "--", PY, "-c", SLEEPER) == 0
    cid = capsys.readouterr().out.strip()
    assert main("--store", env.url, "cmd", "watch", cid, "--clear", "--filter", "(") == 2
    assert "Invalid watch filter regex '('" in capsys.readouterr().err
    assert main("--store", env.url, "cmd", "watch", cid) == 0
    assert capsys.readouterr().out.strip() == NOTHING_SET
    assert main("--store", env.url, "cmd", "watch", cid, "--clear", "--filter", "x") == 0
    assert capsys.readouterr().out.strip() == 'Watch cleared for "srv".'
    assert main("--store", env.url, "cmd", "terminate", cid, "--remove") == 0


MORE = (
    "import sys\n"
    "for i in range(2000): print('L%d' % i, flush=True)\n"
    "for line in sys.stdin:\n"
    "    for i in range(50): print('M%d' % i, flush=True)\n"
)


async def test_dropped_lines_count_while_the_command_runs(
    tools: Tools, capsys: pytest.CaptureFixture[str]
) -> None:
    """Reference: a suspended watch counts every further non-blank line in droppedLines, persisted with each
    chunk. loopd-es records no event per chunk; a read asks the live owner, so the count moves while it runs."""
    from loopd_es.cli.main import main

    cid = await tools.start("flood", "-c", MORE, watch_filter="L")
    suspended = await tools.env.until(tools.store, cid, lambda s: s.watch_state == "flood-suspended")
    logged = suspended.watch_dropped_lines
    await tools.output_until(cid, lambda out: "L1999" in out)
    first = await tools("loopd_command_get", command_id=cid)
    before = first["command"]["watchState"]["droppedLines"]
    assert before >= logged
    assert (await tools("loopd_command_write", command_id=cid, input="go\n"))["ok"]
    await tools.output_until(cid, lambda out: "M49" in out)
    got = await await_until(  # the owner's count, asked before the output is read: wait for it to catch up
        "the live dropped-line count",
        lambda: tools("loopd_command_get", command_id=cid),
        done=lambda a: a["command"]["watchState"]["droppedLines"] >= before + 50,
        within=20,
    )
    assert got["live"] is True
    assert (await tools.env.state(tools.store, cid)).watch_dropped_lines == logged  # no event per line

    def shown() -> int:
        assert main("--store", tools.env.url, "cmd", "show", cid) == 0
        return int(json.loads(capsys.readouterr().out)["watch_dropped_lines"])

    assert await anyio.to_thread.run_sync(shown) >= before + 50
    await tools("loopd_command_terminate", command_id=cid, remove=True)


async def test_input_with_a_nul_reaches_the_terminal(tools: Tools) -> None:
    """The reference sends any input to the PTY; the NUL check on every argument refused it (the log records
    only how many bytes were typed, never the bytes)."""
    cid = await tools.start("srv", "-c", SLEEPER)
    answer = await tools("loopd_command_write", command_id=cid, input="\u001b[A\u0000\n")
    assert answer == {"ok": True, "message": 'Sent 5 byte(s) to "srv".'}
    assert (await tools.env.state(tools.store, cid)).input_bytes == 5
    elsewhere = await tools("loopd_command_start", title="t\u0000", command=PY)
    assert elsewhere["ok"] is False and "NUL" in elsewhere["message"]  # other arguments: still refused
    await tools("loopd_command_terminate", command_id=cid, remove=True)


async def test_resize_finds_the_command_first_and_stores_a_size_when_it_has_ended(tools: Tools) -> None:
    cid = await tools.start("srv", "-c", SLEEPER)
    for cols in (0, 1.5):  # another session's command is not found, whatever the size
        answer = await tools("loopd_command_resize", "ses_b", command_id=cid, cols=cols, rows=10)
        assert answer == {"ok": False, "message": "Command not found."}
    await tools("loopd_command_terminate", command_id=cid)
    stored = await tools("loopd_command_resize", command_id=cid, cols=120, rows=40)
    assert stored == {
        "ok": True,
        "message": 'Terminal size 120x40 stored for "srv" (command is terminated; no terminal to resize).',
    }
    state = await tools.env.state(tools.store, cid)
    assert (state.cols, state.rows) == (120, 40)
    bad = await tools("loopd_command_resize", command_id=cid, cols=0, rows=40)
    assert bad["message"] == "Invalid size 0x40: cols and rows must be positive integers."
    await tools("loopd_command_remove", command_id=cid)


async def test_the_tools_answer_the_reference_record(tools: Tools) -> None:
    """Start, get (and the rest) answered loopd-es's snake_case record (``owner_session_id``, ``end_reason``, a
    nested ``watch``) with ``totalMatches`` beside it in camelCase; the reference's CommandSession is camelCase."""
    started = await tools(
        "loopd_command_start",
        title="srv",
        command=PY,
        args=["-c", SLEEPER],
        env={"TOKEN": "v"},
        timeout_seconds=600,
        watch_until="READY",
    )
    record = started["command"]
    await tools.env.state(tools.store, started["command_id"])
    assert record["ownerSessionID"] == "ses_a" and record["status"] == "running"
    assert record["envKeys"] == ["TOKEN"] and record["timeoutSeconds"] == 600
    assert record["watchUntil"] == "READY" and record["watchUntilAction"] == "stop"
    assert record["watchIgnoreCase"] is False and "watchFilter" not in record
    assert record["watchState"] == {"state": "active", "matches": 0, "pushes": 0, "droppedLines": 0}
    assert record["notifySuccessfulExit"] is True
    assert {"createdAt", "updatedAt", "deadlineAt", "cols", "rows", "outputBytes", "streamBytes"} <= set(
        record
    )
    assert "truncated" in record and "endReason" not in record and "shell" not in record
    assert not any("_" in key for key in record), sorted(record)
    cid = started["command_id"]
    await tools("loopd_command_terminate", command_id=cid)
    ended = (await tools("loopd_command_get", command_id=cid))["command"]
    assert (ended["status"], ended["endReason"], ended["exitCode"] is not None) == (
        "terminated",
        "terminate",
        True,
    )
    assert ended["endedAt"] >= ended["createdAt"] and ended["updatedAt"] >= ended["endedAt"]
    assert ended["signal"] == "SIGTERM" and ended["controlledBy"]["tool"] == "loopd_command_terminate"
    await tools("loopd_command_remove", command_id=cid)


async def test_a_restarted_command_keeps_its_owner_session(tools: Tools) -> None:
    from loopd_es.procs.restart import restart_command

    cid = await tools.start("srv", "-c", SLEEPER, notify_on_exit=False)
    new_id, message = await restart_command(tools.store, tools.env.url, cid)
    assert message == f'Command "srv" restarted as {new_id[:8]}...'
    new = await tools.env.state(tools.store, new_id)
    assert (new.owner_session_id, new.notify_on_exit, new.running) == ("ses_a", False, True)
    assert (await tools("loopd_command_get", command_id=new_id))["command"]["ownerSessionID"] == "ses_a"
    await tools("loopd_command_terminate", command_id=new_id, remove=True)
    await tools("loopd_command_remove", command_id=cid)
