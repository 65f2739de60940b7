"""``history``, ``explain`` and the HTML timeline of goals imported from a loopd project read like the day it
happened: source times (not the import instant), the day's order across streams, ``--at`` a time of that day,
events synthesised from ``state.json`` marked, and ``explain`` giving the causal reason.

The project is ``tests/fixtures/loopd_projects/busy_day`` (written as loopd 1.12.2 writes ``state.json`` v9
and ``events.ndjson``), imported into a real SQLite log through ``loopd-es import-loopd``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest

from loopd_es.cli.main import main
from loopd_es.log import open_store
from loopd_es.postmortem import build_history, find_goal
from loopd_es.postmortem.explain import explain
from loopd_es.postmortem.history import History, render_text
from loopd_es.postmortem.timeline_html import timeline_model

DAY = Path(__file__).resolve().parents[1] / "fixtures" / "loopd_projects" / "busy_day"
TRIAGE, STORAGE, FLAKY, DEPS = (f"5e1f0a3c-7b2d-4c8e-9f10-0000000000{s}" for s in ("a1", "b2", "c3", "d4"))


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:{tmp_path_factory.mktemp('day') / 'log.db'}"
    assert main("--store", url, "import-loopd", str(DAY)) == 0
    return url


def _history(url: str, goal_id: str, at: datetime | None = None) -> History:
    async def run() -> History:
        async with await open_store(url, create=False) as store:
            goal = await find_goal(store, goal_id)
            return await build_history(store, goal, at=at, provenance=True)

    return anyio.run(run)


def _explain(url: str, goal_id: str, at: datetime | None = None) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        async with await open_store(url, create=False) as store:
            goal = await find_goal(store, goal_id)
            history = await build_history(store, goal, at=at, provenance=True)
            from loopd_es.postmortem.explain import to_json

            return to_json(await explain(store, history))

    return anyio.run(run)


def _out(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    capsys.readouterr()
    assert main(*args) == 0
    return capsys.readouterr().out


def test_history_is_dated_by_the_source_and_in_the_order_of_the_day(url: str) -> None:
    history = _history(url, STORAGE)
    times = [e.at for e in history.entries]
    # created at state.json's createdAt (loopd writes the goal.created line a second later)
    assert times[0] == "2026-11-24T09:05:10.000Z" and times[-1].startswith("2026-11-24T15:45:10")
    assert times == sorted(times)  # the streams (goal, command, control requests) merged as the day went
    types = [e.envelope.type for e in history.entries]
    # the owner's pause request comes between the turn it interrupted and the pause itself
    assert types.index("control.requested", types.index("run.started")) < types.index("goal.paused")
    assert all(e.envelope.recorded_at[:10] != "2026-11-24" for e in history.entries)  # recorded: the import


def test_history_text_shows_source_times_and_marks_synthesised_events(url: str) -> None:
    lines = render_text(_history(url, STORAGE))
    created = next(k for k, line in enumerate(lines) if line.endswith("goal.created"))
    assert "2026-11-24 09:05:10.000" in lines[created]
    assert lines[created + 1].strip() == "[imported from ledger line 3]"
    usage = next(k for k, line in enumerate(lines) if " goal.usage_accounted" in line)
    assert lines[usage + 1].strip() == "[synthesised from state.json: goal.usage (time from goal.updatedAt)]"
    assert "2026-11-24 15:45:10.000" in lines[usage]
    kept = next(k for k, line in enumerate(lines) if " goal.runtime_imported" in line)
    assert "run_count=6 budget_turn_count=5" in "\n".join(lines[kept : kept + 8])
    compaction = next(k for k, line in enumerate(lines) if " goal.compaction_started" in line)
    assert "2026-11-24 09:55:10.050" in lines[compaction]
    attempts = next(k for k, line in enumerate(lines[kept:]) if "verification_attempts: +[" in line)
    assert "attempt_id: att-b1" in lines[kept + attempts] and "status: failed" in lines[kept + attempts]


def test_history_at_a_time_of_the_source_day(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = _out(capsys, "--store", url, "history", STORAGE, "--at", "2026-11-24T12:00:00Z")
    first = out.splitlines()[0]
    assert "'Refactor storage': paused/idle" in first and "cut at 2026-11-24T12:00:00" in first
    assert "goal.budget_exhausted" not in out and "goal.paused" in out
    before = _out(capsys, "--store", url, "history", STORAGE, "--at", "2026-11-24T09:00:00Z")
    assert "not created yet" in before.splitlines()[0]
    doc = json.loads(
        _out(capsys, "--store", url, "history", STORAGE, "--json", "--at", "2026-11-24T09:20:00Z")
    )
    assert doc["state"]["run_count"] == 2 and doc["status"] == "active"
    assert all(e["occurred_at"] <= "2026-11-24T09:20:00" for e in doc["events"])
    events = json.loads(_out(capsys, "--store", url, "history", STORAGE, "--json"))["events"]
    marked = [e["type"] for e in events if e.get("imported", {}).get("synthesised")]
    assert "goal.usage_accounted" in marked and "goal.runtime_imported" in marked


def test_explain_gives_the_budget_reason(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    x = _explain(url, STORAGE)
    assert str(x["sentence"]).startswith("budget_limited, because cost $2.0731 ≥ $2.0000")
    assert x["end_kind"] == "import" and len(x["steps"]) == 1
    assert x["flows"] == {}  # the import is not a flow: no list of every imported event
    out = _out(capsys, "--store", url, "explain", STORAGE)
    assert (
        "goal.budget_exhausted (goal, 2026-11-24T15:45:10.000Z)" in out
        and "[imported from ledger line 58]" in out
    )


def test_explain_follows_the_causes_the_source_shows(url: str) -> None:
    blocked = _explain(url, DEPS)
    steps = blocked["steps"]
    assert [s["fact"]["type"] for s in steps] == ["goal.blocked", "run.failed", "run.started"]
    assert "(5 in a row)" in str(blocked["sentence"]) and blocked["end_kind"] == "import"
    done = _explain(url, TRIAGE)  # the scheduled re-run: completed in the turn the schedule tick started
    assert [s["fact"]["type"] for s in done["steps"]] == ["goal.completed", "run.started", "goal.resumed"]
    assert "the goal was resumed from complete (by schedule)" in done["sentence"]
    paused = _explain(url, STORAGE, at=datetime(2026, 11, 24, 12, tzinfo=UTC))
    facts = [s["fact"] for s in paused["steps"]]
    assert [f["type"] for f in facts] == ["goal.paused", "control.requested"]
    assert "the owner asked to pause (control request req-0002" in str(paused["sentence"])
    assert facts[1]["at"] == "2026-11-24T11:01:59.200Z"


def test_the_timeline_spans_the_day_and_marks_synthesised_events(url: str) -> None:
    model = timeline_model(_history(url, FLAKY))
    ts = [e["t"] for e in model["events"]]
    assert (max(ts) - min(ts)) / 3_600_000 > 4  # 10:12 to 14:20, not the milliseconds of the import
    synth = {e["type"] for e in model["events"] if e["synthesised"]}
    assert {"goal.worker_assigned", "goal.usage_accounted", "goal.runtime_imported"} <= synth
    assert not any(e["synthesised"] for e in model["events"] if e["type"] == "run.started")
    origin = next(e["origin"] for e in model["events"] if e["type"] == "goal.usage_accounted")
    assert origin == "synthesised from state.json: goal.usage (time from goal.updatedAt)"


def test_source_times_survive_export_to_another_backend(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = f"ndjson:{tmp_path / 'copy.ndjson'}"
    assert main("--store", url, "export", "--to", copy) == 0
    original = _out(capsys, "--store", url, "history", STORAGE, "--at", "2026-11-24T12:00:00Z")
    exported = _out(capsys, "--store", copy, "history", STORAGE, "--at", "2026-11-24T12:00:00Z")
    assert (
        exported.splitlines()[1:] == original.splitlines()[1:] and "paused/idle" in exported.splitlines()[0]
    )


def test_what_happened_after_the_import_follows_the_day(tmp_path: Path) -> None:
    """Reconciliation is today's fact: it keeps its recorded time and comes after the imported day."""
    url = f"sqlite:{tmp_path / 'log.db'}"
    every = DAY.parent / "every_field"  # its `tail logs` has no deadline: still running at import
    assert main("--store", url, "import-loopd", "--reconcile", str(every)) == 0
    bench = "e1000000-0000-4000-8000-0000000000d4"
    entries = _history(url, bench).entries
    tail = [(e.envelope.type, e.imported) for e in entries[-2:]]
    assert tail == [("command.exited", None), ("command.await-fired", None)]
    assert entries[-3].at.startswith("2026-11-26") and entries[-1].at == entries[-1].envelope.recorded_at
    lines = render_text(_history(url, bench))
    assert lines[-2].split()[1] == entries[-1].envelope.recorded_at[:10]  # dated today, no source mark
    assert not lines[-1].strip().startswith("[")
