"""Importing opencode-loopd projects: formats and upgrades, the mapping, marking, idempotency, atomicity.

The fixture projects in ``tests/fixtures/loopd_projects`` are written in the reference's formats
(docs/reference/loopd.md#s1, #s4-1). Folded states are checked field by field against values written here,
not only against the importer's own comparison.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import pytest

from loopd_es.clock import parse_rfc3339
from loopd_es.domain import command as dc
from loopd_es.domain.evolve import evolve, fold, initial
from loopd_es.errors import StorageError
from loopd_es.events.catalogue import decode_data
from loopd_es.importer import (
    ImportConflictError,
    ImportIncompleteError,
    ImportPlan,
    ImportSourceError,
    apply_plan,
    build_plan,
)
from loopd_es.importer.check import differences
from loopd_es.importer.source import load_state, upgrade
from loopd_es.log import LogStore, open_store

if TYPE_CHECKING:
    from loopd_es.domain.state import GoalState
    from loopd_es.events.envelope import ExpectedVersion, NewEvent

pytestmark = pytest.mark.anyio

PROJECTS = Path(__file__).resolve().parents[1] / "fixtures" / "loopd_projects"
V9 = PROJECTS / "v9_project"
DONE, LIMIT, RUNNING, PAUSED, BUDGET, RETRY, GONE = (
    f"{i}1111111-aaaa-4bbb-8ccc-00000000000{i}" for i in range(1, 8)
)
BUILD, SERVER, LOST, REMOVED = (f"c{i}222222-aaaa-4bbb-8ccc-00000000000{i}" for i in range(1, 5))


def _fold_goal(plan: ImportPlan, goal_id: str) -> GoalState:
    batch = next(b for b in plan.batches if b.stream == f"goal-{goal_id}")
    state = initial(goal_id)
    for event in batch.events:
        state = evolve(state, decode_data(event.type, event.data_bytes()))
    assert state.anomaly_count == 0, state.anomalies
    return state


def _fold_command(plan: ImportPlan, command_id: str) -> dc.CommandState:
    batch = next(b for b in plan.batches if b.stream == f"command-{command_id}")
    state = dc.fold(decode_data(e.type, e.data_bytes()) for e in batch.events)
    assert state is not None
    return state


@pytest.fixture(scope="module")
def plan() -> ImportPlan:
    return build_plan(V9)


async def _store(tmp_path: Path) -> LogStore:
    return await open_store(f"sqlite:{tmp_path / 'log.db'}")


# -- the mapping ------------------------------------------------------------------------------------


def test_v9_goals_fold_to_the_snapshot(plan: ImportPlan) -> None:
    assert plan.warnings == ()
    assert [k.line for k in plan.skipped] == [35]  # the host's second exit report of the build command
    assert plan.needs_reconcile == (SERVER,)
    done = _fold_goal(plan, DONE)
    assert (done.status, done.run_count, done.budget_turn_count, done.evaluator_rejection_count) == (
        "complete",
        3,
        2,
        1,
    )
    assert (done.tokens_used, round(done.cost_used, 4), done.time_used_seconds) == (15400, 0.4215, 312.5)
    assert done.accounted_message_ids == ("msg_a1", "msg_a2", "msg_a3")
    assert done.completion_evidence is not None and done.completion_evidence.evidence == "bun test: 120 pass"
    assert done.config.checks == ("bun test",) and done.config.max_turns == 50
    assert done.worker_session_id == "ses_worker_done" and done.topology == "v1-child"

    limit = _fold_goal(plan, LIMIT)
    assert limit.status == "blocked" and limit.blocker is not None
    assert limit.blocker.kind == "provider-limit" and limit.blocker.reason.startswith(
        "Provider quota exhausted"
    )
    assert (limit.run_count, limit.budget_turn_count, limit.run_generation, limit.consecutive_failures) == (
        4,
        4,
        6,
        1,
    )
    assert limit.config.model == "openai/gpt-5"
    assert limit.model_last is not None and limit.model_last.from_ == "anthropic/claude-opus-4"
    assert limit.model_pending is not None and (limit.model_pending.model, limit.model_pending.reason) == (
        "anthropic/claude-sonnet-4",
        "quota",
    )
    assert limit.model_fallback is not None and limit.model_fallback.status == "prepared"
    assert limit.model_fallback.attempted == ("anthropic/claude-sonnet-4",)
    assert limit.last_provider_limit is not None and limit.last_provider_limit.retry_at == parse_rfc3339(
        "2026-11-20T10:59:00.000Z"
    )
    assert limit.config.fallback_models == ("anthropic/claude-sonnet-4", "google/gemini-2.5-pro")

    running = _fold_goal(plan, RUNNING)
    assert (running.status, running.phase, running.active_run_id, running.run_generation) == (
        "active",
        "running",
        "run-r2",
        7,
    )
    assert running.active_prompt_message_id == "msg_prompt_r2" and running.interactive
    assert running.agent_pending is not None and running.agent_pending.agent == "docs-writer"
    assert running.agent_last_failure is not None and running.agent_last_failure.reason == "host-rejected"

    paused = _fold_goal(plan, PAUSED)
    assert (paused.status, paused.phase, paused.run_count) == ("paused", "idle", 1)
    assert not paused.config.workspace_write and paused.config.checks == ()

    budget = _fold_goal(plan, BUDGET)
    assert (budget.status, budget.run_count, budget.tokens_used) == ("budget_limited", 3, 1200)
    assert budget.config.token_budget == 1000 and budget.config.schedule is not None
    assert budget.pending_identity is not None and budget.pending_identity.agent == "plan"

    retry = _fold_goal(plan, RETRY)
    assert (retry.phase, retry.consecutive_failures, retry.retry_after) == (
        "waiting_retry",
        2,
        parse_rfc3339("2026-11-20T10:26:04.000Z"),
    )


def test_goal_gone_from_the_state_ends_cleared(plan: ImportPlan) -> None:
    gone = _fold_goal(plan, GONE)
    assert gone.cleared and not gone.exists and gone.name == "Scratch experiment"


def test_the_importers_own_comparison_finds_nothing_but_catches_a_change(plan: ImportPlan) -> None:
    state = load_state(V9 / ".opencode" / "loopd" / "state.json").state
    for snap in state.goals:
        runtime = next(rt for rt in state.runtimes if rt.goal_id == snap.id)
        batch = next(b for b in plan.batches if b.stream == f"goal-{snap.id}")
        items = [_emitted(e) for e in batch.events]
        assert differences(snap, runtime, items) == []
    changed = msgspec.structs.replace(state.goals[0], tokens_used=1)
    batch = next(b for b in plan.batches if b.stream == f"goal-{DONE}")
    found = differences(changed, state.runtimes[0], [_emitted(e) for e in batch.events])
    assert found == ["tokens_used: folded 15400, state.json 1"]


def _emitted(event: NewEvent) -> Any:
    from loopd_es.importer.builder import Emitted

    return Emitted(decode_data(event.type, event.data_bytes()), "test")


def test_commands_and_awaits_fold_to_the_snapshot(plan: ImportPlan) -> None:
    build = _fold_command(plan, BUILD)
    assert (build.status, build.end_reason, build.exit_code, build.awaits) == ("exited", "exit", 0, ())
    assert (build.watch_matches, build.watch_pushes) == (
        2,
        1,
    ) and build.ended_at == parse_rfc3339("2026-11-20T10:23:00.000Z")
    server = _fold_command(plan, SERVER)
    assert server.running and server.args == ("run", "dev") and server.env_keys == ("PORT",)
    assert [(a.goal_id, a.until) for a in server.awaits] == [(RUNNING, "listening on")]
    assert server.watch is not None and server.watch.until_action == "keep" and server.watch.ignore_case
    lost = _fold_command(plan, LOST)
    assert (lost.status, lost.end_reason) == ("missing", "missing") and lost.shell
    removed = _fold_command(plan, REMOVED)
    assert removed.removed and removed.status == "exited" and removed.awaits == ()
    types = [e.type for e in next(b for b in plan.batches if b.stream == f"command-{REMOVED}").events]
    assert "command.await-cancelled" in types  # the pause line names no command: matched by its goal


def test_ledger_facts_and_timestamps_reach_the_payloads(plan: ImportPlan) -> None:
    batch = next(b for b in plan.batches if b.stream == f"goal-{LIMIT}")
    by_source = {src: e for e, src in zip(batch.events, batch.sources, strict=True)}
    created = json.loads(by_source["ledger:19"].data_bytes())
    assert parse_rfc3339(created["at"]) == parse_rfc3339(
        "2026-11-20T10:00:00.000Z"
    )  # state.json's createdAt: loopd writes the line later
    blocked = json.loads(by_source["ledger:23"].data_bytes())
    assert (parse_rfc3339(blocked["at"]), blocked["kind"]) == (
        parse_rfc3339("2026-11-20T10:14:00.000Z"),
        "provider-limit",
    )  # blocker.at
    assert (created["occurred_at"], created["imported"]) == (
        "2026-11-20T10:00:00.000Z",
        {"source": "ledger:19", "time_from": "state:goal.createdAt"},
    )
    # turns 2 and 4 have no run.started line: their count comes from state.json, no run is made up for them
    assert not any("runCount" in src for src in by_source)
    runtime = json.loads(by_source["state:runtime"].data_bytes())
    assert (runtime["run_count"], runtime["budget_turn_count"], runtime["ledger_runs"]) == (4, 4, 2)
    assert batch.from_ledger == sum(1 for s in batch.sources if s.startswith("ledger:"))


def test_every_event_names_the_import_and_a_cause_it_had(plan: ImportPlan) -> None:
    """The cause is what the source shows (a run's end -> its start), else the import: never mere order."""
    assert plan.started.correlation_id == plan.stream and plan.stream.startswith("import-")
    ids = {e.event_id: e for b in plan.batches for e in b.events}
    for batch in plan.batches:
        seen = {plan.started.event_id}
        for event in batch.events:
            assert event.correlation_id == plan.stream
            assert event.causation_id in seen or ids[event.causation_id or ""].type == "control.requested"
            seen.add(event.event_id)
    limit = next(b for b in plan.batches if b.stream == f"goal-{LIMIT}")
    by_type = {e.type: e for e in limit.events}
    failed = by_type["run.failed"]
    assert ids[failed.causation_id or ""].type == "run.started"  # run-l1 failed: caused by run-l1's start
    assert by_type["goal.usage_accounted"].causation_id == plan.started.event_id  # no cause in the source
    completed = json.loads(plan.completed.data_bytes())
    sources = {e["event_id"]: e["source"] for s in completed["streams"] for e in s["events"]}
    assert len(sources) == plan.event_count - 2
    assert all(src.startswith(("ledger:", "state:")) for src in sources.values())


def test_plans_are_deterministic(plan: ImportPlan) -> None:
    again = build_plan(V9)
    assert [e.event_id for b in again.batches for e in b.events] == [
        e.event_id for b in plan.batches for e in b.events
    ]
    assert [e.data_bytes() for b in again.batches for e in b.events] == [
        e.data_bytes() for b in plan.batches for e in b.events
    ]


# -- formats ----------------------------------------------------------------------------------------


def test_old_state_versions_are_upgraded_in_memory() -> None:
    raw = json.loads((PROJECTS / "v2_project" / ".opencode" / "loopd" / "state.json").read_text())
    doc = upgrade(raw)
    rt = doc["runtimes"][0]
    assert (rt["runCount"], rt["budgetTurnCount"], rt["runGeneration"], "turnCount" in rt) == (4, 4, 0, False)
    assert doc["goals"][0]["config"]["workspaceWrite"] is True and "schedule" not in doc["goals"][0]["config"]
    assert doc["commands"] == [] and doc["commandAwaits"] == [] and doc["version"] == 9
    assert raw["version"] == 2 and "turnCount" in raw["runtimes"][0]  # the input is not modified
    plan = build_plan(PROJECTS / "v2_project")
    assert plan.warnings == ()
    old = _fold_goal(plan, DONE)
    assert (old.status, old.run_count, old.budget_turn_count, old.config.schedule) == ("complete", 4, 4, None)
    assert json.loads(plan.started.data_bytes())["state_version"] == 2
    assert _fold_goal(plan, PAUSED).status == "paused"


def test_a_torn_last_ledger_line_is_skipped_and_reported() -> None:
    plan = build_plan(PROJECTS / "torn_ledger")
    assert plan.torn_line == 4
    assert any("line 4 is an incomplete write" in w for w in plan.warnings)
    assert json.loads(plan.completed.data_bytes())["skipped_ledger_lines"] == [4]
    state = _fold_goal(plan, DONE)
    assert state.last_progress is None and state.run_count == 1


@pytest.mark.parametrize(
    ("project", "expected"),
    [
        ("corrupt_json", "not valid JSON"),
        ("wrong_shape", "at `$.goals[0].status`"),
        ("unknown_version", "unknown state version 12"),
    ],
)
def test_a_corrupt_state_file_is_a_clear_error(project: str, expected: str) -> None:
    with pytest.raises(ImportSourceError) as info:
        build_plan(PROJECTS / project)
    message = str(info.value)
    assert expected in message and "state.json" in message and "nothing was imported" in message
    assert info.value.exit_code == 2


def test_a_corrupt_complete_ledger_line_is_an_error(tmp_path: Path) -> None:
    project = tmp_path / "p"
    shutil.copytree(PROJECTS / "torn_ledger", project)
    ledger = project / ".opencode" / "loopd" / "events.ndjson"
    lines = ledger.read_text().splitlines()
    ledger.write_text("\n".join([lines[0], "{oops", *lines[1:3]]) + "\n")
    with pytest.raises(ImportSourceError, match=r"events.ndjson: line 2 is not valid JSON"):
        build_plan(project)
    ledger.write_text('{"type": "goal.progress", "goalID": "x"}\n')
    with pytest.raises(ImportSourceError, match="line 1: expected string `type` and `timestamp`"):
        build_plan(project)


def test_a_missing_state_file_or_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ImportSourceError, match="does not exist"):
        build_plan(tmp_path)
    with pytest.raises(ImportSourceError, match="no such directory"):
        build_plan(tmp_path / "nowhere")


def test_a_missing_ledger_means_everything_comes_from_the_snapshot() -> None:
    plan = build_plan(PROJECTS / "v2_project")
    assert all(src.startswith("state:") for b in plan.batches for src in b.sources)


# -- writing ----------------------------------------------------------------------------------------


async def test_import_then_replay_matches_and_a_second_import_adds_nothing(
    tmp_path: Path, plan: ImportPlan
) -> None:
    async with await _store(tmp_path) as store:
        result = await apply_plan(store, plan)
        assert result.appended_events == plan.event_count
        head = await store.head()
        envelopes = [env async for env in store.read_stream(f"goal-{LIMIT}")]
        folded = fold(envelopes, initial(LIMIT))
        assert (folded.status, folded.budget_turn_count, folded.anomaly_count) == ("blocked", 4, 0)
        assert await store.stream_version(plan.stream) == 2
        again = await apply_plan(store, build_plan(V9))
        assert (again.appended_events, again.written) == (0, ())
        assert await store.head() == head


async def test_an_interrupted_import_is_finished_by_running_it_again(
    tmp_path: Path, plan: ImportPlan
) -> None:
    async with await _store(tmp_path) as store:
        failing = _FailingStore(store, fail_on=plan.batches[2].stream)
        with pytest.raises(ImportIncompleteError) as info:
            await apply_plan(failing, plan)
        message = str(info.value)
        assert plan.batches[0].stream in message and plan.batches[2].stream in message
        assert "run the same `loopd-es import-loopd` again" in message
        assert await store.stream_version(plan.batches[2].stream) == 0
        assert await store.stream_version(plan.stream) == 1
        result = await apply_plan(store, plan)
        assert set(result.already) == {plan.batches[0].stream, plan.batches[1].stream}
        assert await store.head() == plan.event_count


async def test_a_changed_project_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    project = tmp_path / "p"
    shutil.copytree(V9, project)
    async with await _store(tmp_path) as store:
        await apply_plan(store, build_plan(project))
        head = await store.head()
        state_file = project / ".opencode" / "loopd" / "state.json"
        doc = json.loads(state_file.read_text())
        doc["revision"] += 1
        doc["goals"][0]["tokensUsed"] += 10
        state_file.write_text(json.dumps(doc))
        with pytest.raises(ImportConflictError, match="already holds other events"):
            await apply_plan(store, build_plan(project))
        assert await store.head() == head


def test_fractions_loopd_accepts_are_imported_with_the_same_effect_and_reported(tmp_path: Path) -> None:
    """loopd stores its tools' numbers as given: a project with ``maxTurns: 2.5`` or ``everyMs: 1500.5`` used to
    be refused whole ("Expected int, got float")."""
    project = tmp_path / "p"
    shutil.copytree(V9, project)
    state_file = project / ".opencode" / "loopd" / "state.json"
    doc = json.loads(state_file.read_text())
    goal = next(g for g in doc["goals"] if g["id"] == BUDGET)
    goal["tokenBudget"] = 999.5
    goal["config"].update(maxTurns=2.5, maxFailures=4.0, timeoutMs=90000.5, compactEvery=2.5)
    goal["config"]["schedule"] = {"everyMs": 1500.5, "maxRuns": 2.5}
    state_file.write_text(json.dumps(doc))
    imported = build_plan(project)
    config = _fold_goal(imported, BUDGET).config
    assert (config.max_turns, config.max_failures, config.timeout_ms, config.compact_every) == (
        3,
        4,
        90000,
        5,
    )
    assert config.schedule is not None and (config.schedule.every_ms, config.schedule.max_runs) == (1500, 3)
    assert config.token_budget == 1000
    reported = {f.path: f.reason for f in imported.dropped_fields}
    for path in ("tokenBudget", "config.maxTurns", "config.timeoutMs", "config.compactEvery",
                 "config.schedule.everyMs", "config.schedule.maxRuns"):  # fmt: skip
        assert "not a whole number" in reported[f"goals[].{path}"]
    assert "goals[].config.maxFailures" not in reported  # 4.0 is 4: nothing to say


def test_a_runtime_of_no_goal_is_reported_whole(tmp_path: Path) -> None:
    """Its fields used to be reported one by one with Python's ``None`` for the goal's status, and the rest
    (``runCount``, ``consecutiveFailures``, ...) not at all."""
    project = tmp_path / "p"
    shutil.copytree(V9, project)
    state_file = project / ".opencode" / "loopd" / "state.json"
    doc = json.loads(state_file.read_text())
    doc["runtimes"].append(
        dict(doc["runtimes"][0], goalID="ffffffff-0000-4000-8000-000000000000", runCount=77)
    )
    state_file.write_text(json.dumps(doc))
    reported = [f for f in build_plan(project).dropped_fields if f.path.startswith("runtimes")]
    orphan = [f for f in reported if f.path == "runtimes[]"]
    assert len(orphan) == 1 and orphan[0].count == 1 and "goalID names none of goals[]" in orphan[0].reason
    assert not any("None" in f.reason for f in reported)
    assert {f.path: f.count for f in reported} == {
        f.path: f.count for f in build_plan(V9).dropped_fields if f.path.startswith("runtimes")
    } | {"runtimes[]": 1}  # the goal-less runtime adds nothing else


class _FailingStore(LogStore):
    """Delegates to a real store, but fails the append of one stream."""

    def __init__(self, inner: LogStore, fail_on: str) -> None:
        self.inner, self.fail_on, self.url = inner, fail_on, inner.url

    async def append(
        self, stream: str, events: Sequence[NewEvent], expected_version: ExpectedVersion = "any", **kw: Any
    ) -> Any:
        if stream == self.fail_on:
            raise StorageError("disk full (simulated)")
        return await self.inner.append(stream, events, expected_version)

    async def _submit(self, request: Any) -> Any:
        if any(part.stream == self.fail_on for part in request.parts):
            raise StorageError("disk full (simulated)")
        writes = [(part.stream, part.events, part.expected) for part in request.parts]
        return [e for out in await self.inner.append_many(writes) for e in out]

    def read_batches(self, **kw: Any) -> AsyncIterator[Any]:
        return self.inner.read_batches(**kw)

    async def head(self) -> int:
        return await self.inner.head()

    async def coord_read(self, prefix: str = "") -> Any:
        return await self.inner.coord_read(prefix)

    async def coord_swap(self, key: str, expected_token: int, new: Any) -> Any:
        return await self.inner.coord_swap(key, expected_token, new)

    async def stream_version(self, stream: str) -> int:
        return await self.inner.stream_version(stream)

    async def streams(self) -> list[str]:
        return await self.inner.streams()

    async def verify(self, *, repair: bool = False) -> Any:
        return await self.inner.verify(repair=repair)

    async def import_envelopes(self, batches: AsyncIterator[Any]) -> int:
        return await self.inner.import_envelopes(batches)

    async def aclose(self) -> None:
        pass


# -- a busy day, as loopd 1.12.2 wrote it: source time, nothing dropped, counters as the source says ----

DAY = PROJECTS / "busy_day"
TRIAGE, STORAGE, FLAKY, DEPS = (f"5e1f0a3c-7b2d-4c8e-9f10-0000000000{s}" for s in ("a1", "b2", "c3", "d4"))
UNIT, CI_WATCH, DEV = (f"9c4d2e1f-3a5b-4c6d-8e7f-0000000000{s}" for s in ("e1", "e2", "e3"))


@pytest.fixture(scope="module")
def day() -> ImportPlan:
    return build_plan(DAY)


def _ledger_lines(project: Path) -> list[dict[str, Any]]:
    text = (project / ".opencode" / "loopd" / "events.ndjson").read_text()
    return [json.loads(line) for line in text.splitlines()]


def _payloads(plan: ImportPlan, stream: str) -> list[dict[str, Any]]:
    batch = next(b for b in plan.batches if b.stream == stream)
    return [{"type": e.type, **json.loads(e.data_bytes())} for e in batch.events]


def test_every_imported_event_carries_the_time_the_source_gives(day: ImportPlan) -> None:
    ledger = _ledger_lines(DAY)
    for batch in day.batches:
        for event in batch.events:
            data = json.loads(event.data_bytes())
            source, time_from = data["imported"]["source"], data["imported"]["time_from"]
            assert data["occurred_at"].startswith("2026-11-24T"), (batch.stream, event.type, data)
            if source.startswith("ledger:") and time_from == source:  # the line's own timestamp
                assert data["occurred_at"] == ledger[int(source[7:]) - 1]["timestamp"]
            elif source.startswith("ledger:"):  # the state's exact time of the fact the line reports
                assert time_from.startswith("state:goal.") or time_from.startswith("state:command."), data
            else:
                assert source.startswith("state:") and time_from, (event.type, data)
    storage = {p["type"]: p for p in _payloads(day, f"goal-{STORAGE}")}
    assert (
        storage["goal.usage_accounted"]["occurred_at"] == "2026-11-24T15:45:10.000Z"
    )  # the goal's updatedAt
    assert storage["goal.usage_accounted"]["imported"]["time_from"] == "state:goal.updatedAt"
    control = _payloads(day, "control-req-0002")
    assert [(p["type"], p["occurred_at"]) for p in control] == [
        ("control.requested", "2026-11-24T11:01:59.200Z"),
        ("control.completed", "2026-11-24T11:02:00.010Z"),
    ]
    flaky = _payloads(day, f"goal-{FLAKY}")
    worker = next(p for p in flaky if p["type"] == "goal.worker_assigned")
    assert (worker["occurred_at"], worker["imported"]["source"]) == (
        "2026-11-24T10:11:59.000Z",  # at the goal's creation (state.json's createdAt)
        "state:goal.workerSessionID",
    )


def test_every_parseable_ledger_line_is_imported_or_reported(day: ImportPlan) -> None:
    count = len(_ledger_lines(DAY))
    imported = {int(src[7:]) for b in day.batches for src in b.sources if src.startswith("ledger:")}
    skipped = {k.line: k for k in day.skipped}
    assert imported | set(skipped) == set(range(1, count + 1)) and not imported & set(skipped)
    assert sorted(skipped) == [10, 26, 35, 50, 52]
    assert "repeated exit report" in skipped[35].reason and skipped[35].type == "command.exited"
    assert "run-c3 has no run.started line" in skipped[50].reason
    storage = [p["type"] for p in _payloads(day, f"goal-{STORAGE}")]
    assert "goal.compaction_started" in storage and "goal.compaction_completed" in storage
    completed = json.loads(day.completed.data_bytes())
    assert [(k["line"], k["type"]) for k in completed["skipped"]] == [(k.line, k.type) for k in day.skipped]
    assert completed["skipped_ledger_lines"] == [10, 26, 35, 50, 52]


def test_a_torn_tail_is_one_more_reported_line() -> None:
    """The busy day with loopd killed mid-append: the last line has no newline and is cut inside a string."""
    plan = build_plan(PROJECTS / "busy_day_torn_tail")
    assert plan.torn_line == 59
    assert [k.line for k in plan.skipped] == [10, 26, 35, 50, 52, 59]
    assert "incomplete write" in plan.skipped[-1].reason
    assert json.loads(plan.completed.data_bytes())["skipped_ledger_lines"][-1] == 59


def test_control_requests_are_imported_as_requests_and_outcomes(day: ImportPlan) -> None:
    streams = sorted(b.stream for b in day.batches if b.stream.startswith("control-"))
    assert streams == [f"control-req-000{i}" for i in range(1, 6)]
    pause = next(b for b in day.batches if b.stream == "control-req-0002")
    assert [e.type for e in pause.events] == ["control.requested", "control.completed"]
    assert json.loads(pause.events[1].data_bytes())["outcome"] == "handled"
    goal = next(b for b in day.batches if b.stream == f"goal-{STORAGE}")
    paused = next(e for e in goal.events if e.type == "goal.paused")
    resumed = next(e for e in goal.events if e.type == "goal.resumed")
    assert paused.causation_id == pause.events[0].event_id  # the pause is the owner's request's doing
    resume = next(b for b in day.batches if b.stream == "control-req-0004")
    assert resumed.causation_id == resume.events[0].event_id
    unit = next(b for b in day.batches if b.stream == f"command-{UNIT}")
    start = next(b for b in day.batches if b.stream == "control-req-0001")
    assert unit.events[0].causation_id == start.events[0].event_id  # cmd_start -> command.started


def test_counters_stay_what_the_source_says(day: ImportPlan) -> None:
    for batch in day.batches:
        assert not any("runCount" in src for src in batch.sources), batch.stream  # no run is made up
    storage = _fold_goal(day, STORAGE)
    assert (storage.run_count, storage.budget_turn_count, storage.run_generation) == (6, 5, 6)
    flaky_events = _payloads(day, f"goal-{FLAKY}")
    assert [p["run_id"] for p in flaky_events if p["type"] == "run.started"] == ["run-c1", "run-c2", "run-c4"]
    flaky = _fold_goal(day, FLAKY)
    assert (flaky.phase, flaky.active_run_id, flaky.run_count, flaky.budget_turn_count) == (
        "running",
        "run-c4",
        4,
        4,
    )
    assert (flaky.run_generation, flaky.active_prompt_message_id) == (5, "msg_prompt_c4")
    kept = {
        p["goal_id"]: p
        for b in day.batches
        for p in _payloads(day, b.stream)
        if p["type"] == "goal.runtime_imported"
    }
    assert kept[FLAKY]["active_tool_call_ids"] == ["call_7f3a"] and kept[FLAKY]["ledger_runs"] == 3
    assert (kept[TRIAGE]["next_run_at"], kept[TRIAGE]["last_schedule_at"]) == (
        "2026-11-24T11:00:01.000Z",
        "2026-11-24T10:00:01.000Z",
    )
    assert [a["attempt_id"] for a in kept[TRIAGE]["verification_attempts"]] == ["att-a1", "att-a2"]
    assert kept[TRIAGE]["last_parent_notified_for"] == "complete"
    assert kept[DEPS]["last_parent_notified_for"] == "blocked"
    assert kept[STORAGE]["last_compact_at"] == "2026-11-24T09:56:02.000Z"
    assert kept[STORAGE]["verification_attempts"][0]["failed_checks"] == ["bun test"]
    triage = _fold_goal(day, TRIAGE)
    assert (triage.schedule_run_count, triage.next_run_at) == (2, parse_rfc3339("2026-11-24T11:00:01.000Z"))


def test_an_old_v1_project_keeps_its_counters() -> None:
    plan = build_plan(PROJECTS / "v1_project")
    assert plan.warnings == () and plan.skipped == ()
    notes = "0a1b2c3d-0000-4000-8000-0000000000f2"
    state = _fold_goal(plan, notes)
    assert (state.status, state.run_count, state.budget_turn_count, state.no_progress_count) == (
        "paused",
        1,
        1,
        1,
    )
    assert json.loads(plan.started.data_bytes())["state_version"] == 1
    times = [p["occurred_at"] for p in _payloads(plan, f"goal-{notes}")]
    assert times[0] == "2026-03-02T09:00:00.000Z" and all(t.startswith("2026-03-02T") for t in times)


def test_a_budget_stop_says_which_budget_and_its_limit(day: ImportPlan) -> None:
    stop = next(p for p in _payloads(day, f"goal-{STORAGE}") if p["type"] == "goal.budget_exhausted")
    assert (stop["budget"], stop["limit"], stop["cost_used"]) == ("cost", 2.0, 2.0731)
    assert stop["imported"]["source"] == "ledger:58"
    assert _fold_goal(day, STORAGE).status == "budget_limited"


def test_commands_keep_their_ids_owners_and_notifications(day: ImportPlan) -> None:
    dev = _payloads(day, f"command-{DEV}")  # removed from state.json: known from the ledger only
    assert [p["type"] for p in dev] == ["command.started", "command.exited", "command.removed"]
    assert all(p["command_id"] == DEV for p in dev)
    unit = {p["type"]: p for p in _payloads(day, f"command-{UNIT}")}
    assert parse_rfc3339(unit["command.exited"]["owner_notified_at"]) == parse_rfc3339(
        "2026-11-24T09:33:12.300Z"
    )
    assert unit["command.started"]["owner_session_id"] == "ses_owner_day"  # its command tools still reach it
    ci = {p["type"]: p for p in _payloads(day, f"command-{CI_WATCH}")}
    assert ci["command.await-requested"]["owner_session_id"] == "ses_w_flaky"
    assert day.needs_reconcile == ()  # its deadline (15:02) passed before loopd's last write (15:45:10)
    ci_state = _fold_command(day, CI_WATCH)
    assert (ci_state.status, ci_state.end_reason, ci_state.ended_at) == (
        "missing",
        "timeout",
        parse_rfc3339("2026-11-24T15:02:00.000Z"),
    )
    assert ci_state.awaits == () and ci["command.await-fired"]["status"] == "missing"
    assert parse_rfc3339(ci["command.await-requested"]["at"]) == parse_rfc3339(
        "2026-11-24T14:03:00.000Z"
    )  # commandAwaits[].createdAt


def test_control_lines_of_the_ledger_are_requests_and_outcomes_too(tmp_path: Path) -> None:
    """``command.accepted``/``command.rejected`` (declared by loopd, never written by 1.12.2) are not dropped."""
    project = tmp_path / "p"
    shutil.copytree(DAY, project)
    ledger = project / ".opencode" / "loopd" / "events.ndjson"
    extra = [
        {"version": 1, "eventID": "x1", "type": "command.accepted", "timestamp": "2026-11-24T16:00:00.000Z",
         "revision": 0, "requestID": "req-0099", "command": "cmd_kill"},
        {"version": 1, "eventID": "x2", "type": "command.rejected", "timestamp": "2026-11-24T16:00:01.000Z",
         "revision": 0, "requestID": "req-0099", "command": "cmd_kill", "reason": "command not running"},
        {"version": 1, "eventID": "x3", "type": "command.accepted", "timestamp": "2026-11-24T16:00:02.000Z",
         "revision": 0, "requestID": "req-0002", "command": "pause"},
    ]  # fmt: skip
    with ledger.open("a") as f:
        f.writelines(json.dumps(o) + "\n" for o in extra)
    plan = build_plan(project)
    events = _payloads(plan, "control-req-0099")
    assert [(p["type"], p.get("outcome"), p.get("reason")) for p in events] == [
        ("control.requested", None, None),
        ("control.completed", "rejected", "command not running"),
    ]
    assert [p["imported"]["source"] for p in events] == ["ledger:59", "ledger:60"]
    assert [(k.line, "already in state.json" in k.reason) for k in plan.skipped][-1] == (61, True)


def test_the_read_models_show_the_source_times(tmp_path: Path) -> None:
    """Ended runs, awaits and a goal's last update are the day's times, not the import instant."""
    import sqlite3

    from loopd_es.cli.main import main

    url = f"sqlite:{tmp_path / 'log.db'}"
    assert main("--store", url, "import-loopd", str(DAY)) == 0
    assert main("--store", url, "project") == 0
    with sqlite3.connect(tmp_path / "log.db.read.db") as db:
        runs = db.execute(
            "SELECT run_id, started_at, ended_at FROM runs WHERE goal_id = ?", (STORAGE,)
        ).fetchall()
        awaited = db.execute(
            "SELECT requested_at, ended_at FROM awaits WHERE command_id = ?", (UNIT,)
        ).fetchone()
        updated = db.execute("SELECT updated_at FROM goals WHERE goal_id = ?", (DEPS,)).fetchone()
    assert ("run-b1", "2026-11-24T09:05:11.390Z", "2026-11-24T09:15:02.700Z") in runs
    assert awaited == ("2026-11-24T09:31:00.400Z", "2026-11-24T09:33:12.050Z")
    assert updated == ("2026-11-24T11:30:00.050Z",)  # the runtime record's updatedAt


def test_a_lossy_ledger_still_accounts_for_every_line(tmp_path: Path) -> None:
    """loopd's ledger loses lines (docs/reference/loopd.md#s4-1): with any one line lost, each remaining line
    is imported or reported."""
    project = tmp_path / "p"
    shutil.copytree(DAY, project)
    ledger = project / ".opencode" / "loopd" / "events.ndjson"
    lines = (DAY / ".opencode" / "loopd" / "events.ndjson").read_text().splitlines(keepends=True)
    for lost in range(len(lines)):
        ledger.write_text("".join(lines[:lost] + lines[lost + 1 :]))
        plan = build_plan(project)
        imported = {int(s[7:]) for b in plan.batches for s in b.sources if s.startswith("ledger:")}
        skipped = {k.line for k in plan.skipped}
        assert imported | skipped == set(range(1, len(lines))) and not imported & skipped, lost
        for batch in plan.batches:
            if batch.stream.startswith("goal-"):
                state = initial(batch.stream[5:])
                for event in batch.events:
                    state = evolve(state, decode_data(event.type, event.data_bytes()))
                assert state.anomaly_count == 0, (lost, batch.stream, state.anomalies)


def test_a_control_request_id_that_could_name_a_path_is_refused(tmp_path: Path) -> None:
    """Request ids become ``control-<requestID>`` streams: held to the one id shape, like goal and command ids."""
    project = tmp_path / "p"
    shutil.copytree(DAY, project)
    state_file = project / ".opencode" / "loopd" / "state.json"
    doc = json.loads(state_file.read_text())
    doc["commandLedger"][1]["requestID"] = "../../x"
    state_file.write_text(json.dumps(doc))
    with pytest.raises(ImportSourceError, match=r"commandLedger\[1\].requestID: invalid control request id"):
        build_plan(project)
