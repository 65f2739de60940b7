"""The command tools through a real ``opencode serve``: an owner session starts a process, reads it, stops it.

The owner's model is the fake (``CALL <tool> <json>`` makes it call the tool once); OpenCode runs the tool file
``loopd-es opencode install`` wrote, which forwards the call with its session to ``loopd-es run``. What the model
got back is read from OpenCode's own transcript (the tool part's output); what happened, from the log.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from loopd_es.host.opencode import OpenCodeHost
from tests.waits import alet_time_pass, await_until

from .test_opencode_e2e import Stack, data, of_type

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.timeout(180)]

SERVER = "import time\nprint('server ready on 8080', flush=True)\ntime.sleep(60)\n"


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    s = Stack(tmp_path)
    try:
        yield s
    finally:
        s.stop()


async def tool_parts(client: httpx.AsyncClient, session: str, tool: str) -> list[dict[str, Any]]:
    reply = await client.get(f"/session/{session}/message")
    reply.raise_for_status()
    return [
        p
        for m in reply.json()
        for p in m.get("parts", [])
        if p.get("type") == "tool" and p.get("tool") == tool
    ]


async def tool_output(
    client: httpx.AsyncClient, session: str, tool: str, seen: int, within: float = 60
) -> dict[str, Any]:
    """The engine's answer to the session's next call of ``tool`` (after ``seen`` earlier ones), as OpenCode
    handed it to the model."""

    async def state() -> dict[str, Any]:
        parts = (await tool_parts(client, session, tool))[seen:]
        found: dict[str, Any] = parts[0].get("state", {}) if parts else {}
        if found.get("status") == "error":
            raise AssertionError(f"{tool} failed inside OpenCode: {found.get('error')}")
        return found

    done = await await_until(
        f"{tool} to complete", state, done=lambda s: s.get("status") == "completed", within=within
    )
    answer: dict[str, Any] = json.loads(done["output"])
    return answer


async def test_an_owner_session_starts_reads_and_terminates_a_command(stack: Stack) -> None:
    stack.start_engine()
    host = OpenCodeHost(stack.opencode.url)
    client = httpx.AsyncClient(base_url=stack.opencode.url, timeout=10)
    pids: list[int] = []
    try:
        owner = await host.create_worker(title="owner")
        other = await host.create_worker(title="someone else")

        async def call(session: str, tool: str, args: dict[str, Any]) -> dict[str, Any]:
            seen = len(await tool_parts(client, session, tool))
            await host.prompt(session, f"CALL {tool} {json.dumps(args)}", model="fake/good", agent="build")
            return await tool_output(client, session, tool, seen)

        start = {"title": "dev server", "command": sys.executable, "args": ["-c", SERVER]}
        started = await call(owner.session_id, "loopd_command_start", start)
        assert started["ok"] is True, started
        cid = started["command_id"]
        assert (
            started["message"]
            == f'Command "dev server" started as {cid[:8]}... (read it with loopd_command_get).'
        )
        offered = [r["tools"] for r in stack.fake.requests if r["session"] == owner.session_id]
        assert "loopd_command_start" in offered[0] and "loopd_command_get" in offered[0]

        envs = await stack.until("the command to spawn", lambda e: bool(of_type(e, "command.spawned")))
        record = data(of_type(envs, "command.started")[0])
        assert record["owner_session_id"] == owner.session_id  # the tool knew which session called it
        assert record["cwd"] == str(
            await anyio.Path(stack.project).resolve()
        )  # the calling session's directory
        spawned = data(of_type(envs, "command.spawned")[0])
        pids += [spawned["pid"], spawned["supervisor_pid"]]

        got = await await_until(
            "the command's ready line",
            lambda: call(owner.session_id, "loopd_command_get", {"command_id": cid}),
            done=lambda got: got["ok"] is True and "server ready on 8080" in got["output"],
        )
        assert got["live"] is True and got["command"]["status"] == "running"

        stranger = await call(other.session_id, "loopd_command_get", {"command_id": cid})
        assert stranger == {"ok": False, "message": "Command not found for this session."}

        stopped = await call(owner.session_id, "loopd_command_terminate", {"command_id": cid})
        assert stopped["ok"] is True and stopped["message"] == 'Command "dev server" terminated.', stopped
        envs = await stack.until("the exit", lambda e: bool(of_type(e, "command.exited")))
        exited = data(of_type(envs, "command.exited")[0])
        assert (exited["status"], exited["end_reason"]) == ("terminated", "terminate")
    finally:
        await client.aclose()
        await host.aclose()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


async def texts_in(client: httpx.AsyncClient, session: str, head: str) -> list[str]:
    reply = await client.get(f"/session/{session}/message")
    reply.raise_for_status()
    return [
        p["text"]
        for m in reply.json()
        for p in m.get("parts", [])
        if p.get("type") == "text" and str(p.get("text", "")).startswith(head)
    ]


async def test_the_owner_session_is_told_of_a_watch_push_and_of_the_exit(stack: Stack) -> None:
    stack.start_engine()
    host = OpenCodeHost(stack.opencode.url)
    client = httpx.AsyncClient(base_url=stack.opencode.url, timeout=10)
    try:
        owner = await host.create_worker(title="owner")
        body = "import sys, time\nprint('compiling', flush=True)\nprint('ERROR: missing semicolon', flush=True)\ntime.sleep(2.5)\nsys.exit(3)\n"
        args = {"title": "build", "command": sys.executable, "args": ["-c", body], "watch_filter": "ERROR"}
        await host.prompt(
            owner.session_id, f"CALL loopd_command_start {json.dumps(args)}", model="fake/good", agent="build"
        )
        started = await tool_output(client, owner.session_id, "loopd_command_start", 0)
        assert started["ok"] is True, started
        cid = started["command_id"]
        exits = await await_until(
            "the exit notice in the owner session",
            lambda: texts_in(client, owner.session_id, '[command "build"'),
            within=60,
        )
        assert f"exited {cid[:8]}... exitCode=3 signal=none]" in exits[0] and "missing semicolon" in exits[0]
        [push] = await texts_in(client, owner.session_id, '[watch "build"]')
        assert "ERROR: missing semicolon" in push and "compiling" not in push
        await alet_time_pass(1.0, "a second exit notice, were one told, reaches the session")
        assert len(await texts_in(client, owner.session_id, '[command "build"')) == 1
    finally:
        await client.aclose()
        await host.aclose()
