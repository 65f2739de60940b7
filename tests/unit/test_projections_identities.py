"""The ``identities`` and ``provider_limits`` read models: every switch with who, why and how it ended."""

from __future__ import annotations

from pathlib import Path

import pytest

from projections import Identities, ProviderLimits

from .test_projections_base import M1, M2, M3, M4, A, built, rows

pytestmark = pytest.mark.anyio
__all__ = ("built",)


def _switches(read_db: Path) -> dict[str, dict[str, object]]:
    return {
        r["switch_id"]: r for r in rows(read_db, "SELECT * FROM identity_switches WHERE goal_id = ?", (A,))
    }


async def test_every_switch_has_its_outcome_who_and_why(built: Path) -> None:
    found = _switches(built)
    summary = {k: (v["status"], v["requested_by"], v["reason"], v["target"]) for k, v in found.items()}
    assert summary == {
        "sw-old": ("replaced", "owner-1", "owner", "agent"),  # a later deferred agent switch took its place
        "sw-d": ("applied", "owner-1", "owner", "model"),  # deferred, then applied as sw-p
        "sw-a": ("superseded", "owner-1", "owner", "agent"),  # an explicit agent switch landed first
        "sw-p": ("applied", "owner-1", "owner", "model"),
        "sw-x": ("applied", "owner-1", "owner", "agent"),  # only its outcome is in the log
        "sw-q": ("applied", "fallback", "quota", "model"),
        "sw-c": ("rolled-back", "owner-1", "owner", "identity"),
        "sw-r": ("rollback-failed", "owner-1", "owner", "identity"),
        "sw-u": ("unsupported", "owner-1", "owner", "model"),
    }
    assert (found["sw-d"]["continued_as"], found["sw-p"]["pending_of"], found["sw-p"]["pending"]) == (
        "sw-p",
        "sw-d",
        1,
    )
    c = found["sw-c"]
    assert (c["from_model"], c["from_agent"], c["stage"], c["failure_reason"]) == (
        M1,
        "build",
        "host",
        "host-rejected",
    )
    assert (c["host_calls"], c["saga_outcome"], c["recovered"]) == (3, "rolled-back", 0)
    assert (found["sw-q"]["model"], found["sw-q"]["from_model"]) == (
        M2,
        M4,
    )  # applied's from_* wins over the saga's


async def test_history_lists_identity_and_saga_events_in_log_order(built: Path) -> None:
    history = rows(built, "SELECT * FROM identity_history WHERE goal_id = ? ORDER BY position", (A,))
    positions = [h["position"] for h in history]
    assert positions == sorted(positions)
    c = [(h["event"], h["detail"]) for h in history if h["switch_id"] == "sw-c"]
    assert c == [
        ("requested", None),
        ("saga-started", "session ses-1, rollback target prov/m1 / build"),
        ("host-call", f"forward switch_model({M3})"),
        ("host-call-ok", "forward switch_model: applied"),
        ("host-call", "forward switch_agent(build)"),
        ("host-call-failed", "forward switch_agent: rejected"),
        ("host-call", f"compensate switch_model({M2})"),
        ("host-call-ok", "compensate switch_model: applied"),
        ("saga-finished", "rolled-back"),
        ("failed", "host: host-rejected"),
        ("rolled-back", "switched back"),
    ]
    assert {h["requested_by"] for h in history if h["switch_id"] == "sw-q"} == {"fallback"}
    events = {h["event"] for h in history}
    assert {"deferred", "requested", "applied", "failed", "rolled-back", "rollback-failed", "unsupported",
            "host-call-resolved"} <= events  # fmt: skip


async def test_provider_limit_observations_and_fallback_state(built: Path) -> None:
    (seen,) = rows(built, "SELECT * FROM provider_limit_observations WHERE goal_id = ?", (A,))
    assert (seen["kind"], seen["source"], seen["model"], seen["status_code"], seen["marks_blocker"]) == (
        "rate-limit", "session-error", M4, 429, 0,
    )  # fmt: skip
    (fb,) = rows(built, "SELECT * FROM provider_fallbacks WHERE goal_id = ?", (A,))
    assert fb["fallback_models"] == f'["{M2}","{M3}"]' and fb["current_model"] == M2
    assert (fb["status"], fb["prepared_model"], fb["attempted"]) == (
        "unavailable",
        None,
        f'["{M4}","{M2}","{M3}"]',
    )
    assert (fb["observations"], fb["last_kind"], fb["last_status_code"]) == (1, "rate-limit", 429)


async def test_fallback_prepared_is_shown_until_the_next_fallback_fact(tmp_path: Path) -> None:
    from loopd_es.log import open_store
    from loopd_es.projector import Projector

    from .test_projections_base import append_story, story

    steps = story()
    cut = next(
        k
        for k, (_, events) in enumerate(steps)
        if any(e.event_type == "identity.fallback_prepared" for e in events)
    )
    async with await open_store(f"sqlite:{tmp_path / 'events.db'}") as log:
        await append_story(log, steps[: cut + 1])
        async with await Projector.open(
            log, [ProviderLimits(), Identities()], tmp_path / "read.db"
        ) as projector:
            await projector.run_once()
    (fb,) = rows(
        tmp_path / "read.db",
        "SELECT status, prepared_model, attempted FROM provider_fallbacks WHERE goal_id = ?",
        (A,),
    )
    assert fb == {"status": "prepared", "prepared_model": M2, "attempted": f'["{M4}","{M2}"]'}
