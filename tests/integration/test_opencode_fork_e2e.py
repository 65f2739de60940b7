"""Fork and bundle against a real ``opencode serve``: a goal runs turns through the engine, is forked at a
counted reply, and the fork's worker is OpenCode's own fork of the worker session at that message (read
back from OpenCode's transcript); the engine then runs the fork on that session. The goal's bundle holds no
planted secret.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from loopd_es.host.opencode import OpenCodeHost

from .test_opencode_e2e import Stack, cli, data, of_type

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.timeout(240)]

SECRET = "sk-proj-E2eForkSecret0123456789abcdef"


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    s = Stack(tmp_path)
    try:
        yield s
    finally:
        s.stop()


def stop_engine(stack: Stack) -> None:
    assert stack.engine is not None
    stack.engine.send_signal(signal.SIGTERM)
    stack.engine.wait(timeout=30)


async def test_a_fork_of_a_real_session_at_a_message_continues_on_opencodes_fork(
    stack: Stack, tmp_path: Path
) -> None:
    stack.fake.worker_script = [("call", "report_goal_progress", {"summary": "first step", "next": "second"})]
    created = cli(
        stack.project,
        stack.env,
        *("goal", "create", "essay", "--objective", f"Write it; OPENAI_API_KEY={SECRET}"),
        *("--model", "fake/good", "--max-turns", "6", "--check", "true"),
    )
    assert created.returncode == 0, created.stderr
    stack.start_engine()
    envs = await stack.until("two counted turns", lambda e: len(of_type(e, "goal.usage_accounted")) >= 2)
    stop_engine(stack)
    envs = await stack.events()
    goal_stream = of_type(envs, "goal.created")[0].stream
    goal_id = goal_stream.removeprefix("goal-")
    worker = data(of_type(envs, "goal.worker_assigned")[0])["worker_session_id"]
    point = of_type(envs, "goal.usage_accounted")[0]
    last = data(point)["message_ids"][-1]

    paused = cli(stack.project, stack.env, "goal", "pause", goal_id)  # one active writer at a time
    assert paused.returncode == 0, paused.stderr
    forked = cli(stack.project, stack.env, "fork", goal_id, "--at", str(point.position), "--json")
    assert forked.returncode == 0, forked.stderr
    report = json.loads(forked.stdout)
    made = report["worker"]
    assert made["method"] == "fork" and made["source_session_id"] == worker  # read from the server's /doc
    assert report["first_turn"] == "started"

    host = OpenCodeHost(stack.opencode.url)
    try:
        source = await host.messages(worker, limit=1000)
        copy = await host.messages(made["session_id"], limit=1000)
        ids = [m.message_id for m in source]
        kept = source[: ids.index(last) + 1]
        assert len(kept) < len(source)  # the fork really cut the conversation at the message
        # the fork holds the kept messages, then the prompt of its own first turn
        assert [(m.role, m.text) for m in copy[: len(kept)]] == [(m.role, m.text) for m in kept]
        assert made["kept_messages"] == len(kept)
    finally:
        await host.aclose()

    # the engine runs the fork on OpenCode's fork: its next prompt lands on the forked session
    fork_stream = f"goal-{report['goal_id']}"
    stack.start_engine()
    await stack.until(
        "a turn of the fork",
        lambda e: any(x.stream == fork_stream and x.type == "goal.usage_accounted" for x in e),
    )
    assert any(r["session"] == made["session_id"] for r in stack.fake.requests)
    compared = cli(stack.project, stack.env, "compare", goal_id, report["goal_id"], "--json")
    assert compared.returncode == 0, compared.stderr
    assert json.loads(compared.stdout)["relation"] == "fork"

    bundle = tmp_path / "essay.bundle"
    made_bundle = cli(stack.project, stack.env, "bundle", goal_id, "-o", str(bundle))
    assert made_bundle.returncode == 0, made_bundle.stderr
    assert SECRET.encode() not in bundle.read_bytes()
    history = cli(stack.project, stack.env, "--store", f"bundle:{bundle}", "history", goal_id)
    assert history.returncode == 0 and f"fork {report['goal_id']} made at #{point.position}" in history.stdout
