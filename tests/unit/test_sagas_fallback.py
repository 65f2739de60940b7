"""docs/reference/loopd.md#s7-f and docs/reference/loopd.md#s3-11 against the fallback flow: classify, prepare
in order, once per model, never wake."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from loopd_es.app.service import Ctx
from loopd_es.clock import parse_rfc3339
from loopd_es.host.errors import ProviderErrorInfo
from loopd_es.host.sim_script import FailureRule
from projections.goals import pending_text

from ._saga_harness import World, world

pytestmark = pytest.mark.anyio

RATE = {
    "data": {
        "statusCode": 429,
        "message": "secret diagnostic",
        "responseHeaders": {"authorization": "SECRET", "retry-after": "60"},
    }
}


async def _observe(w: World, gid: str, error: Any = None, **kwargs: Any) -> list[str]:
    recorded = await w.goals.observe_error(gid, RATE if error is None else error, Ctx.new(), **kwargs)
    return [e.type for e in recorded]


@pytest.mark.parametrize(
    "error",
    [
        "network rate limit",
        "authentication quota exceeded",
        "maximum context length exceeded",
        "cost budget limit",
        "maxTurns reached",
        "paused",
        "quota information unknown",
        "request timeout",
        "Invalid API key",
        {"statusCode": 401, "message": "quota exceeded"},
        {"statusCode": 403, "message": "rate limited"},
    ],
)
async def test_s59_not_limits_record_no_observation(tmp_path: Path, error: Any) -> None:
    async with world(tmp_path) as w:
        gid = await w.create(fallback_models=("p/new",))
        types = await _observe(w, gid, error)
        assert "identity.provider_limit_observed" not in types
        assert (await w.state(gid)).model_pending is None


async def test_s59_rate_limit_observed_without_secrets(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        gid = await w.create()
        await _observe(w, gid)
        limit = (await w.state(gid)).last_provider_limit
        assert limit is not None and (limit.kind, limit.status_code, limit.model) == (
            "rate-limit",
            429,
            "p/old",
        )
        assert limit.retry_at == parse_rfc3339("2026-12-02T12:01:00.000Z")
        events = await w.events()
        raw = b"".join(bytes(e.data) for e in events)
        assert b"SECRET" not in raw  # headers are never stored
        observed = b"".join(bytes(e.data) for e in events if e.type == "identity.provider_limit_observed")
        assert (
            b"diagnostic" not in observed
        )  # the observation holds no message; lastError keeps it (reference)
        assert (await w.state(gid)).last_error == "secret diagnostic"
        await _observe(w, gid, {"statusCode": 429, "retryAfter": "Wed, 07 Oct 2026 12:00:00 GMT"})
        limit = (await w.state(gid)).last_provider_limit
        assert limit is not None and limit.retry_at == parse_rfc3339("2026-10-07T12:00:00.000Z")
        await _observe(w, gid, {"code": "insufficient_quota"})
        limit = (await w.state(gid)).last_provider_limit
        assert limit is not None and limit.kind == "quota"


async def test_s62_prompt_delivery_quota_is_a_fallback_turn_and_the_next_turn_applies_it_at_once(
    tmp_path: Path,
) -> None:
    async with world(tmp_path) as w:
        gid = await w.create(interactive=False, fallback_models=("p/new", "p/last"))  # 2 turns so far
        session = (await w.state(gid)).worker_session_id or ""
        info = ProviderErrorInfo(status_code=429, message="quota delivery failure SECRET")
        await w.host.inject(FailureRule(op="prompt", error="provider", provider=info, on_call=3))
        await w.replied(gid)
        await w.goals.idle(gid, Ctx.new())
        state = await w.state(gid)
        assert state.last_provider_limit is not None and state.last_provider_limit.source == "prompt-delivery"
        assert state.model_pending is not None and (
            state.model_pending.model,
            state.model_pending.reason,
        ) == ("p/new", "quota")
        assert state.phase == "waiting_retry" and state.retry_after == w.clock.now()  # due now: no backoff
        assert state.consecutive_failures == 0 and state.last_error is None  # not a failure (#22)
        types = [e.type for e in await w.events()]
        assert "run.failed" not in types and "run.fell_back" in types
        await w.replied(gid)
        turn = await w.goals.idle(gid, Ctx.new())
        assert turn.result == "started" and [r.outcome for r in turn.switches] == ["applied"]
        state = await w.state(gid)
        assert (
            state.config.model == "p/new"
            and state.model_last is not None
            and state.model_last.reason == "quota"
        )
        assert (await w.prompts(session))[-1].model == "p/new"


async def test_s63_interactive_goal_records_and_prepares_but_is_never_woken(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        gid = await w.create(interactive=True, fallback_models=("p/new",))
        session = (await w.state(gid)).worker_session_id or ""
        await _observe(w, gid, {"error": None, "data": {"statusCode": 429, "message": "rate limited"}})
        state = await w.state(gid)
        assert state.last_provider_limit is not None and state.last_provider_limit.source == "session-error"
        assert state.model_pending is not None and state.model_pending.model == "p/new"
        assert pending_text(state) == "model p/new (rate limit)"  # the limit as observed, not "quota"
        assert state.phase == "waiting_retry"
        w.clock.advance(3600)
        assert (await w.goals.idle(gid, Ctx.new())).result == "interactive"
        assert len(await w.prompts(session)) == 1 and await w.switch_calls() == []


async def test_each_fallback_at_most_once_and_no_cycling(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        gid = await w.create(fallback_models=("p/new", "p/last", "p/old"))
        seen = []
        for _ in range(4):
            types = await _observe(w, gid)
            state = await w.state(gid)
            if state.model_pending is not None:
                seen.append(state.model_pending.model)
                await w.goals.apply_pending(gid, Ctx.new())
            else:
                assert "identity.fallback_exhausted" in types
        assert seen == ["p/new", "p/last"]
        fallback = (await w.state(gid)).model_fallback
        assert fallback is not None and fallback.status == "exhausted"
        assert fallback.attempted == ("p/old", "p/new", "p/last")


async def test_duplicate_observations_do_not_advance(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        gid = await w.create(fallback_models=("p/new", "p/last"))
        await _observe(w, gid)
        await _observe(w, gid)
        state = await w.state(gid)
        assert state.model_pending is not None and state.model_pending.model == "p/new"
        assert state.model_fallback is not None and "p/last" not in state.model_fallback.attempted


async def test_stale_observation_for_a_replaced_model_prepares_nothing(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        gid = await w.create(fallback_models=("p/new",))
        await w.goals.switch_identity(gid, Ctx.new(), model="p/last")
        types = await _observe(w, gid, expected_model="p/old")
        assert "identity.provider_limit_observed" in types and "identity.fallback_prepared" not in types
        assert (await w.state(gid)).model_pending is None


@pytest.mark.parametrize("setup", ["paused", "manual-pending", "pending-pair"])
async def test_ineligible_goals_prepare_nothing(tmp_path: Path, setup: str) -> None:
    async with world(tmp_path) as w:
        gid = await w.create(interactive=False, idle=setup == "paused", fallback_models=("p/last",))
        if setup == "paused":
            await w.goals.pause(gid, Ctx.new())
        elif setup == "manual-pending":
            await w.goals.switch_identity(gid, Ctx.new(), model="p/new")
        else:
            await w.goals.switch_identity(gid, Ctx.new(), model="p/new", agent="new")
        await _observe(w, gid)
        state = await w.state(gid)
        assert state.last_provider_limit is not None
        assert state.model_fallback is None
        assert state.model_pending is None or state.model_pending.model == "p/new"
