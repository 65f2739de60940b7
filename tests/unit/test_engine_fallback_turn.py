"""A limit with a fallback ready ends the turn as a fallback turn, not a failure (issue #22, item 4).

On the simulated host with the engine's real event path: OpenCode's retry status (in any provider's words, or
none recognisable) on a goal with an unused fallback aborts the turn; no ``run.failed``, no failure count, no
backoff, and the next prompt goes out at once on the fallback with no warning.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from loopd_es.host.events import SessionError, SessionStatusChanged

from ._engine_harness import Rig, rig

pytestmark = pytest.mark.anyio

ANTHROPIC = (
    "This request would exceed the rate limit for your organization (4f1a) of 50,000 input tokens per minute. "
    "For details, refer to: https://docs.claude.com/en/api/rate-limits."
)


async def _retrying(r: Rig, sid: str, message: str) -> None:
    await r.engine.on_host_event(
        SessionStatusChanged(session_id=sid, status="retry", message=message, attempt=1, next_at_ms=None)
    )
    await r.pump()


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        (ANTHROPIC, "rate-limit"),
        ("Resource has been exhausted (e.g. check quota).", "rate-limit"),
        ("Provider is overloaded", "rate-limit"),
        ("Free usage exceeded, add credits https://opencode.ai/zen", "quota"),
        ("Internal server error", "rate-limit"),  # any retry status counts while a fallback is unused
    ],
)
async def test_a_retry_status_with_an_unused_fallback_is_a_fallback_turn(
    tmp_path: Path, message: str, kind: str
) -> None:
    async with rig(tmp_path) as r:
        gid, sid = await r.started(model="openai/gpt-5", fallback_models=("anthropic/claude-sonnet-4-5",))
        await _retrying(r, sid, message)
        state = await r.state(gid)
        types = await r.types(gid)
        assert "run.failed" not in types and "run.fell_back" in types
        assert (state.consecutive_failures, state.last_error, state.phase) == (0, None, "waiting_retry")
        assert state.last_provider_limit is not None and state.last_provider_limit.kind == kind
        await r.advance(0)  # no backoff: the next turn is due at once
        state = await r.state(gid)
        assert state.phase == "running" and state.config.model == "anthropic/claude-sonnet-4-5"
        snapshot = await r.host.snapshot()
        assert snapshot.prompts[-1].model == "anthropic/claude-sonnet-4-5"
        assert (
            "WARNINGS" not in snapshot.prompts[-1].text
            and "consecutive failure" not in snapshot.prompts[-1].text
        )
        async for env in r.store.read_stream(f"goal-{gid}"):
            if env.type == "identity.fallback_prepared":
                assert env.data_dict()["limit"] == kind  # the reason as observed, not always "quota"


async def test_a_retry_status_without_an_unused_fallback_leaves_the_turn_to_opencode(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        gid, sid = await r.started(model="openai/gpt-5")
        await _retrying(r, sid, ANTHROPIC)
        state = await r.state(gid)
        assert state.phase == "running" and state.last_provider_limit is None
        assert not [t for t in await r.types(gid) if t in ("run.failed", "run.fell_back")]


async def test_a_session_error_limit_with_a_fallback_is_a_fallback_turn_and_without_one_a_failure(
    tmp_path: Path,
) -> None:
    error = {"name": "APIError", "statusCode": 429, "message": ANTHROPIC, "type": "rate_limit_error"}
    async with rig(tmp_path) as r:
        gid, sid = await r.started(model="openai/gpt-5", fallback_models=("anthropic/claude-sonnet-4-5",))
        await r.engine.on_host_event(SessionError(session_id=sid, error=error))
        await r.pump()
        state = await r.state(gid)
        assert (state.consecutive_failures, state.last_error) == (0, None)
        assert "run.fell_back" in await r.types(gid)
        await r.advance(0)
        assert (await r.state(gid)).phase == "running"
        await r.engine.on_host_event(SessionError(session_id=sid, error=error))  # no fallback left
        await r.pump()
        state = await r.state(gid)
        assert (state.consecutive_failures, state.last_error) == (1, ANTHROPIC)  # the message, word for word
        assert (await r.types(gid)).count("run.failed") == 1


async def test_a_fallback_turn_that_meets_a_busy_worker_goes_out_on_its_idle(tmp_path: Path) -> None:
    """The abort's idle may reach the engine after the due turn found the worker still busy."""
    async with rig(tmp_path) as r:
        gid, sid = await r.started(model="openai/gpt-5", fallback_models=("anthropic/claude-sonnet-4-5",))
        await _retrying(r, sid, ANTHROPIC)
        await r.host.go_busy(sid)
        r.seen.clear()  # the busy status itself is not what this test is about
        await r.advance(0)
        assert (await r.state(gid)).phase == "waiting_retry"  # due, but the worker said busy
        await r.host.go_idle(sid)
        await r.pump()
        state = await r.state(gid)
        assert state.phase == "running" and state.config.model == "anthropic/claude-sonnet-4-5"
