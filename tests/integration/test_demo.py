"""``loopd-es demo`` tells its whole story from the real log and read models, on a fresh directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio

from loopd_es.log import open_store


def test_demo_plays_the_story_and_every_claim_is_in_the_log(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "loopd_es", "demo"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    out = result.stdout
    for claim in (
        "Identity switch: deferred",
        "pending switch: Identity switched to openai/gpt-5 / plan on the same worker/session.",
        "fallback prepared after a rate limit: anthropic/claude-sonnet-4-5",
        "pending switch: Identity switched to anthropic/claude-sonnet-4-5 / plan",
        "Switch rejected:",
        "rolled-back",
        "goal is blocked: Reached max turns (2)",
        "[engine] engine running: holder demo-engine",
        'Loop goal "report" stopped: Reached max turns (2) (child did not wrap up).',
    ):
        assert claim in out, f"{claim!r} missing from the demo's output"
    root = tmp_path / "loopd-demo"
    assert (root / "timeline.html").stat().st_size > 1000

    async def types() -> list[str]:
        async with await open_store(f"sqlite:{root / 'events.db'}", create=False) as store:
            return [e.type async for batch in store.read_batches() for e in batch]

    recorded = anyio.run(types)
    for event_type in (
        "identity.switch_deferred",
        "identity.switch_applied",
        "identity.provider_limit_observed",
        "identity.fallback_prepared",
        "identity.switch_rolled_back",
        "goal.blocked",
        "saga.host_call_failed",
        "run.idle_candidate",
        "goal.force_finish_requested",
        "notification.delivered",
    ):
        assert event_type in recorded, f"the story claims {event_type} but the log has none"

    again = subprocess.run(
        [sys.executable, "-m", "loopd_es", "demo"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert again.returncode == 0, "a second demo replaces the first one's directory"
