"""The ``goals`` and ``runs`` read models: rows as the domain fold sees the goal, runs and how each ended."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loopd_es.domain.evolve import fold, initial
from loopd_es.domain.streams import goal_stream
from loopd_es.events import goal as g
from loopd_es.events import identity as i
from loopd_es.events.catalogue import new_event
from loopd_es.log import open_store
from loopd_es.projector import Projector
from projections import ALL, Goals, Runs

from .test_projections_base import M2, A, B, T, append_story, built, rows, story

pytestmark = pytest.mark.anyio
__all__ = ("built",)


async def test_goal_row_matches_the_domain_fold(built: Path, tmp_path: Path) -> None:
    (a,) = rows(built, "SELECT * FROM goals WHERE goal_id = ?", (A,))
    async with await open_store(f"sqlite:{tmp_path / 'events.db'}") as log:
        state = fold([e async for e in log.read_stream(goal_stream(A))], initial(A))
    assert state.status == "blocked" and state.anomaly_count == 1  # the stale run.completed
    assert a == {
        "goal_id": A, "name": "docs", "objective": "write the docs", "owner": "owner-1", "status": "blocked",
        "phase": "idle", "cleared": 0, "interactive": 1, "model": M2, "agent": "plan", "pending_switch": None,
        "switch_in_flight": None, "worker_session_id": "ses-1", "turns_used": 5, "max_turns": 50, "runs": 6,
        "tokens_used": 100, "token_budget": 10_000, "cost_used": 0.01, "cost_budget": 1.0,
        "time_used_seconds": 2.5, "timeout_ms": 600_000, "blocker_reason": "needs an API key",
        "blocker_needed": "set KEY", "blocker_kind": "provider-limit", "last_error": "401",
        "last_progress": "outline written", "last_progress_next": "write chapter 1", "last_progress_at": T,
        "fallback_status": "unavailable", "created_at": T, "updated_at": a["updated_at"],
        "version": state.version, "position": state.position, "anomalies": 1, "options": a["options"],
        "created_by": None, "ended_by": None, "controlled_by": None,  # no tool call in this story
    }  # fmt: skip
    options = json.loads(a["options"])  # named as loopd_create_goal names them
    assert (options["tokenBudget"], options["costBudget"], options["timeoutMs"]) == (10_000, 1.0, 600_000)


async def test_cleared_goal_keeps_its_row(built: Path) -> None:
    (b,) = rows(built, "SELECT goal_id, cleared, owner, created_at FROM goals WHERE goal_id = ?", (B,))
    assert b["cleared"] == 1 and b["owner"] == "owner-2" and b["created_at"]  # created_at from the envelope


async def test_pending_switch_shows_until_applied(tmp_path: Path) -> None:
    async with await open_store(f"sqlite:{tmp_path / 'events.db'}") as log:
        await log.append(
            goal_stream("g1"),
            [new_event(g.GoalCreated(goal_id="g1", name="n", objective="o", owner_session_id="me"))],
            "any",
        )
        await log.append(
            goal_stream("g1"),
            [new_event(i.IdentitySwitchDeferred(goal_id="g1", switch_id="s1", model="p/x", agent="build"))],
            "any",
        )
        async with await Projector.open(log, [Goals()], tmp_path / "read.db") as projector:
            await projector.run_once()
    (row,) = rows(tmp_path / "read.db", "SELECT pending_switch, status, phase FROM goals")
    assert row == {"pending_switch": "p/x / build", "status": "active", "phase": "queued"}


async def test_events_before_goal_created_make_no_row(tmp_path: Path) -> None:
    async with await open_store(f"sqlite:{tmp_path / 'events.db'}") as log:
        await log.append(goal_stream("ghost"), [new_event(g.GoalPaused(goal_id="ghost"))], "any")
        async with await Projector.open(log, [Goals()], tmp_path / "read.db") as projector:
            await projector.run_once()
    assert rows(tmp_path / "read.db", "SELECT * FROM goals") == []


async def test_runs_end_when_the_fold_releases_them(built: Path) -> None:
    found = rows(
        built,
        "SELECT run_id, generation, turn, kind, charged, status, end_event, error, failure_source, "
        "consecutive_failures, tokens, stuck_seconds, watchdog, confirm_failed, idle_candidate_at IS NOT NULL AS idle "
        "FROM runs WHERE goal_id = ? ORDER BY generation",
        (A,),
    )
    assert [(r["run_id"], r["status"], r["end_event"]) for r in found] == [
        ("r1", "completed", "run.completed"),
        ("r2", "failed", "run.failed"),
        ("r3", "recovered", "run.recovered"),
        ("r4", "superseded", "run.started"),
        ("r5", "interrupted", "goal.completion_rejected"),
        ("r6", "interrupted", "goal.blocked"),
    ]
    r1, r2, r3 = found[:3]
    assert r1["tokens"] == 100 and r1["idle"] == 1 and r1["charged"] == 1
    assert (r2["error"], r2["failure_source"], r2["consecutive_failures"]) == (
        "429 Too Many Requests", "session-error", 1,
    )  # fmt: skip
    assert (r3["kind"], r3["charged"], r3["stuck_seconds"], r3["watchdog"], r3["confirm_failed"]) == (
        "bare", 0, 90.0, "busy", "worker-active",
    )  # fmt: skip


async def test_a_running_row_agrees_with_the_goal_phase_after_every_append(tmp_path: Path) -> None:
    steps = [(stream, [e]) for stream, events in story() for e in events if stream == goal_stream(A)]
    async with await open_store(f"sqlite:{tmp_path / 'events.db'}") as log:
        async with await Projector.open(log, [Goals(), Runs()], tmp_path / "read.db") as projector:
            seen = set()
            for step in steps:
                await append_story(log, [step])
                await projector.run_once()
                (goal,) = rows(tmp_path / "read.db", "SELECT phase, runs FROM goals")
                running = rows(tmp_path / "read.db", "SELECT run_id FROM runs WHERE status = 'running'")
                assert len(running) == (goal["phase"] == "running"), step
                seen.add(goal["phase"])
    assert {"running", "idle", "waiting_retry"} <= seen


def test_registry_holds_every_read_model() -> None:
    assert [p.name for p in ALL] == [
        "stream_stats", "goals", "runs", "identities", "provider_limits", "commands", "awaits", "goal_links",
        "notifications", "loops",
    ]  # fmt: skip
    assert isinstance(Runs().version, int)
