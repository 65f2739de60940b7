"""A scripted log of real domain events for the read-model tests, and rebuild == incremental over it.

:func:`story` is one goal's eventful life (runs, a deferred switch applied later, a provider-limit fallback, a
combined switch rolled back, a rollback that failed, budgets, a block) beside a cleared goal and two command
sessions with awaits: every event type the six read models handle appears at least once.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from loopd_es.clock import parse_rfc3339
from loopd_es.events import command as c
from loopd_es.events import goal as g
from loopd_es.events import identity as i
from loopd_es.events import run as r
from loopd_es.events import saga as s
from loopd_es.events.base import Event
from loopd_es.events.catalogue import new_event
from loopd_es.log import LogStore, open_store
from loopd_es.projector import Projector
from projections import ALL

pytestmark = pytest.mark.anyio

A, B = "a1b2c3d4-goal-a", "a1b2ffff-goal-b"
M1, M2, M3, M4 = "prov/m1", "prov/m2", "prov/m3", "prov/m4"
T = "2026-12-02T10:00:00.000Z"
TABLES = (
    "goals", "goals_fold", "runs", "runs_fold", "identity_switches", "identity_history", "identity_owners",
    "provider_limit_observations", "provider_fallbacks", "commands", "commands_fold", "awaits",
)  # fmt: skip

Step = tuple[str, list[Event]]


def _saga(sw: str, goal: str, calls: list[tuple[str, str, str, str]], outcome: s.SagaOutcome) -> Step:
    """A switch saga's stream: start, each (purpose, op, arg, result) call, finish."""
    events: list[Event] = [
        s.SwitchSagaStarted(switch_id=sw, goal_id=goal, session_id="ses-1", from_model=M1, from_agent="build")
    ]
    for purpose, op, arg, result in calls:
        key = f"{sw}/{purpose}/{op}"
        events.append(s.HostCallIntended(switch_id=sw, key=key, op=op, arg=arg, purpose=purpose))  # type: ignore[arg-type]
        if result == "failed":
            events.append(s.HostCallFailed(switch_id=sw, key=key, reason="rejected"))
        elif result == "resolved":
            events.append(s.HostCallResolved(switch_id=sw, key=key, landed=True, live_model=arg))
        else:
            events.append(s.HostCallSucceeded(switch_id=sw, key=key, result=result))  # type: ignore[arg-type]
    events.append(s.SwitchSagaFinished(switch_id=sw, goal_id=goal, outcome=outcome))
    return f"switch-{sw}", events


def story() -> list[Step]:
    """The scripted log, as (stream, events) appends in order."""
    ga, gb = f"goal-{A}", f"goal-{B}"
    config = g.GoalConfig(
        model=M1,
        agent="build",
        fallback_models=(M2, M3),
        token_budget=10_000,
        cost_budget=1.0,
        timeout_ms=600_000,
    )
    watch = c.WatchSpec(filter="ERROR", until="done")
    return [
        (ga, [g.GoalCreated(goal_id=A, name="docs", objective="write the docs", owner_session_id="owner-1",
                            config=config, at=parse_rfc3339(T)),
              g.GoalWorkerAssigned(goal_id=A, worker_session_id="ses-1")]),
        (gb, [g.GoalCreated(goal_id=B, name="scratch", objective="try", owner_session_id="owner-2")]),
        (ga, [r.RunStarted(goal_id=A, run_id="r1", generation=1, prompt_message_id="p1", turn_count=1, at=parse_rfc3339(T)),
              g.GoalUsageAccounted(goal_id=A, message_ids=("m-1",), token_delta=100, cost_delta=0.01,
                                   time_delta_seconds=2.5),
              r.RunIdleCandidate(goal_id=A, run_id="r1", generation=1),
              r.RunCompleted(goal_id=A, run_id="r1", generation=1),
              r.RunCompleted(goal_id=A, run_id="r1", generation=1)]),  # the second one is stale: refused
        (ga, [i.IdentitySwitchDeferred(goal_id=A, switch_id="sw-old", agent="review"),
              i.IdentitySwitchDeferred(goal_id=A, switch_id="sw-d", model=M4),
              i.IdentitySwitchDeferred(goal_id=A, switch_id="sw-a", agent="plan")]),  # replaces sw-old
        (ga, [i.IdentitySwitchRequested(goal_id=A, switch_id="sw-p", model=M4, pending=True,
                                        requested_by="pending")]),
        _saga("sw-p", A, [("forward", "switch_model", M4, "applied")], "applied"),
        (ga, [i.IdentitySwitchApplied(goal_id=A, switch_id="sw-p", target="model", to_model=M4, from_model=M1)]),
        (ga, [i.IdentitySwitchApplied(goal_id=A, switch_id="sw-x", target="agent", to_agent="plan",
                                      from_agent="build")]),  # explicit: supersedes the deferred sw-a
        (gb, [g.GoalCleared(goal_id=B)]),
        (ga, [r.RunStarted(goal_id=A, run_id="r2", generation=2, prompt_message_id="p2", turn_count=2),
              r.RunFailed(goal_id=A, run_id="r2", error="429 Too Many Requests", consecutive_failures=1,
                          retry_after=parse_rfc3339("2026-12-02T10:05:00Z")),
              i.ProviderLimitObserved(goal_id=A, kind="rate-limit", source="session-error", observed_at=parse_rfc3339(T),
                                      model=M4, status_code=429, retry_at=parse_rfc3339("2026-12-02T10:05:00Z")),
              i.FallbackPrepared(goal_id=A, model=M2, attempted=(M4, M2))]),
        (ga, [i.IdentitySwitchRequested(goal_id=A, switch_id="sw-q", model=M2, pending=True, reason="quota",
                                        requested_by="pending")]),
        _saga("sw-q", A, [("forward", "switch_model", M2, "applied")], "applied"),
        (ga, [i.IdentitySwitchApplied(goal_id=A, switch_id="sw-q", target="model", to_model=M2, from_model=M4,
                                      reason="quota")]),
        (ga, [i.IdentitySwitchRequested(goal_id=A, switch_id="sw-c", model=M3, agent="build",
                                        requested_by="owner-1")]),
        _saga("sw-c", A, [("forward", "switch_model", M3, "applied"), ("forward", "switch_agent", "build", "failed"),
                          ("compensate", "switch_model", M2, "applied")], "rolled-back"),
        (ga, [i.IdentitySwitchFailed(goal_id=A, switch_id="sw-c", target="identity", stage="host",
                                     reason="host-rejected"),
              i.IdentitySwitchRolledBack(goal_id=A, switch_id="sw-c", model=M2, agent="plan")]),
        (ga, [i.IdentitySwitchRequested(goal_id=A, switch_id="sw-r", model=M3, agent="build",
                                        requested_by="owner-1")]),
        _saga("sw-r", A, [("forward", "switch_model", M3, "applied"), ("forward", "switch_agent", "build", "failed"),
                          ("compensate", "switch_model", M2, "resolved")], "rollback-failed"),
        (ga, [i.IdentitySwitchFailed(goal_id=A, switch_id="sw-r", target="identity", stage="host",
                                     reason="host-rejected"),
              i.IdentityRollbackFailed(goal_id=A, switch_id="sw-r", model=M2, agent="plan"),
              i.IdentitySwitchUnsupported(goal_id=A, switch_id="sw-u", model=M3),
              i.FallbackExhausted(goal_id=A, attempted=(M4, M2, M3)),
              i.FallbackUnsupported(goal_id=A, attempted=(M4, M2, M3)),
              i.FallbackUnavailable(goal_id=A, attempted=(M4, M2, M3))]),
        (ga, [r.RunStarted(goal_id=A, run_id="r3", generation=3, prompt_message_id="p3", turn_count=3,
                           charged=False, kind="bare"),
              r.RunStuck(goal_id=A, run_id="r3", stuck_seconds=90.0),
              r.RunConfirmFailed(goal_id=A, generation=3, reason="worker-active"),
              r.RunRecovered(goal_id=A, run_id="r3", quiet_seconds=120.0, generation=3),
              r.RunStarted(goal_id=A, run_id="r4", generation=4, prompt_message_id="p4", turn_count=4),
              r.RunStarted(goal_id=A, run_id="r5", generation=5, prompt_message_id="p5", turn_count=5),
              g.GoalProgressReported(goal_id=A, summary="outline written", next="write chapter 1", at=parse_rfc3339(T)),
              g.GoalInputQueued(goal_id=A, input_id="in-1", text="also cover the CLI"),
              g.GoalInputDelivered(goal_id=A, input_ids=("in-1",), run_id="r5"),
              g.GoalForceFinishRequested(goal_id=A, reason="turn limit"),
              g.GoalCompletionRejected(goal_id=A, attempt_id="at-1", rejection_count=1, failed_check_count=1,
                                       failure_summary="tests fail", free_retry=False),
              g.GoalInteractiveChanged(goal_id=A, interactive=True),
              g.GoalPaused(goal_id=A),
              g.GoalResumed(goal_id=A),
              g.GoalNudged(goal_id=A),
              g.GoalWorkerAborted(goal_id=A),
              g.GoalBudgetExhausted(goal_id=A, reason="cost budget spent"),
              g.GoalStatusChanged(goal_id=A, from_status="budget_limited", to_status="active"),
              g.GoalRetried(goal_id=A),
              r.RunStarted(goal_id=A, run_id="r6", generation=6, prompt_message_id="p6", turn_count=6),
              g.GoalBlocked(goal_id=A, reason="needs an API key", needed="set KEY", kind="provider-limit",
                            last_error="401")]),
        ("command-c1", [c.CommandStarted(command_id="c1", title="build", command="make", args=["all"], cwd="/w",
                                         watch=watch, goal_id=A, started_at=parse_rfc3339(T)),
                        c.CommandSpawned(command_id="c1", pid=42, supervisor_pid=41),
                        c.AwaitRequested(goal_id=A, command_id="c1", until="done"),
                        c.AwaitRequested(goal_id=A, command_id="c1"),  # already waiting: no second row
                        c.WatchMatched(command_id="c1", lines=3, matches=2, pushes=1),
                        c.InputWritten(command_id="c1", bytes=5),
                        c.CommandResized(command_id="c1", cols=120, rows=40),
                        c.UntilStopped(command_id="c1", until="done"),
                        c.SignalSent(command_id="c1", signal="SIGTERM", reason="until"),
                        c.CommandExited(command_id="c1", status="terminated", end_reason="until", exit_code=143,
                                        signal="SIGTERM", ended_at=parse_rfc3339(T)),
                        c.AwaitFired(goal_id=A, command_id="c1", status="terminated", exit_code=143,
                                     until="done", matched_lines=["done"], evidence="done")]),
        ("command-c2", [c.CommandStarted(command_id="c2", title="serve", command="serve", cwd="/w",
                                         started_at=parse_rfc3339(T)),
                        c.WatchSet(command_id="c2", watch=c.WatchSpec(filter="GET")),
                        c.WatchSuspended(command_id="c2", reason="flood", pushes=3),
                        c.AwaitRequested(goal_id=A, command_id="c2"),
                        c.AwaitCancelled(goal_id=A, command_id="c2", reason="goal paused"),
                        c.AwaitRequested(goal_id=B, command_id="c2"),
                        c.AwaitDiscarded(goal_id=B, command_id="c2", reason="goal gone"),
                        c.AwaitRequested(goal_id=A, command_id="c2"),
                        c.CommandExited(command_id="c2", status="exited", end_reason="exit", exit_code=0,
                                        ended_at=parse_rfc3339(T)),
                        c.AwaitFired(goal_id=B, command_id="c2", status="exited", exit_code=0, immediate=True),
                        c.CommandRemoved(command_id="c2")]),
    ]  # fmt: skip


async def append_story(store: LogStore, steps: list[Step] | None = None) -> int:
    """Append the story (or some of its steps); returns the log head."""
    for stream, events in steps if steps is not None else story():
        await store.append(stream, [new_event(e) for e in events], "any")
    return await store.head()


def dump(path: Path, tables: tuple[str, ...] = TABLES, *, parked: bool = True) -> dict[str, list[Any]]:
    """Every row of the read models' tables, sorted, plus the parked events."""
    conn = sqlite3.connect(path)
    try:
        result = {t: sorted(conn.execute(f"SELECT * FROM {t}").fetchall(), key=repr) for t in tables}
        if parked:
            result["parked"] = conn.execute("SELECT name, position, error FROM projector_parked").fetchall()
        return result
    finally:
        conn.close()


def rows(path: Path, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(row) for row in conn.execute(sql, params)]
    finally:
        conn.close()


@pytest.fixture(params=["sqlite", "ndjson"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[LogStore]:
    name = "events.db" if request.param == "sqlite" else "events.ndjson"
    async with await open_store(f"{request.param}:{tmp_path / name}") as opened:
        yield opened


@pytest.fixture
async def built(tmp_path: Path) -> AsyncIterator[Path]:
    """The story projected into a read database (SQLite log); yields the read database's path."""
    async with await open_store(f"sqlite:{tmp_path / 'events.db'}") as log:
        await append_story(log)
        async with await Projector.open(log, ALL, tmp_path / "read.db") as projector:
            await projector.run_once()
    yield tmp_path / "read.db"


@pytest.mark.parametrize("chunks", [3, 7])
async def test_rebuild_equals_incremental_row_by_row(store: LogStore, tmp_path: Path, chunks: int) -> None:
    steps = story()
    read_db = tmp_path / "incremental.db"
    async with await Projector.open(store, ALL, read_db) as projector:
        size = -(-len(steps) // chunks)
        for k in range(0, len(steps), size):  # many catch-ups: the batch boundaries fall everywhere
            await append_story(store, steps[k : k + size])
            await projector.run_once()
        built = dump(read_db)
        assert built["parked"] == [] and all(built[t] for t in TABLES), "every table has rows, nothing parked"
        await projector.rebuild()
        assert dump(read_db) == built
    async with await Projector.open(store, ALL, tmp_path / "fresh.db") as projector:
        await projector.run_once()  # one big catch-up
    assert dump(tmp_path / "fresh.db") == built


async def test_event_by_event_equals_batches(tmp_path: Path) -> None:
    """``apply`` one at a time (the parking path) leaves the rows ``apply_batch`` does."""
    async with await open_store(f"sqlite:{tmp_path / 'events.db'}") as log:
        await append_story(log)
        async with await Projector.open(log, ALL, tmp_path / "batch.db") as projector:
            await projector.run_once()
        envelopes = [e async for e in log.read_all()]
    conn = sqlite3.connect(tmp_path / "single.db", isolation_level=None)
    for projection in ALL:
        projection.schema(conn)
        for env in envelopes:
            projection.apply(conn, env)
    conn.close()
    tables = (*TABLES, "stream_stats")
    assert dump(tmp_path / "single.db", tables, parked=False) == dump(
        tmp_path / "batch.db", tables, parked=False
    )
