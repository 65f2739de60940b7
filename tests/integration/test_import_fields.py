"""Every field of a loopd ``state.json`` is kept (``replay --json`` shows it) or reported with its reason.

The walk is the test's own, not the importer's: each key of each fixture project's ``state.json`` (recursively)
must have its value in the folded state of the stream it belongs to (a goal's or runtime's in ``goal-<id>``, a
command's or await's in ``command-<id>``, a control request's in ``control-<id>``, the file's version and
revision in ``import-<id>``), or be named in the import's report (``import.completed``'s dropped fields) with a
reason of its own. A field loopd adds later is reported as unknown, which this test refuses: it fails until
the field is kept or given its reason in :mod:`loopd_es.importer.fields`. Runs on the SQLite and NDJSON logs.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loopd_es.cli.main import main
from loopd_es.importer import build_plan
from loopd_es.importer.fields import UNKNOWN
from tests.integration.test_import_cli import url as url  # the same two backends

PROJECTS = Path(__file__).resolve().parents[1] / "fixtures" / "loopd_projects"
IMPORTABLE = (
    "busy_day",
    "busy_day_torn_tail",
    "every_field",
    "torn_ledger",
    "v1_project",
    "v2_project",
    "v9_project",
)
EVERY = PROJECTS / "every_field"
DONE, BLOCKED, BUDGET, RUNNING = (f"e1000000-0000-4000-8000-0000000000{s}" for s in ("a1", "b2", "c3", "d4"))


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    capsys.readouterr()
    code = main(*args)
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def _import(capsys: pytest.CaptureFixture[str], url: str, project: Path) -> dict[str, Any]:
    """Import ``project``, then ``replay --json`` the whole log: every stream's folded state by name."""
    _run(capsys, "--store", url, "import-loopd", str(project))
    states: dict[str, Any] = json.loads(_run(capsys, "--store", url, "replay", "--json"))
    return states


def _leaves(obj: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(path, value) of every scalar under ``obj``; list items are ``[i]`` in the path."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from _leaves(value, f"{path}.{key}" if path else key)
    elif isinstance(obj, list):
        for i, item in enumerate(obj):
            yield from _leaves(item, f"{path}[{i}]")
    else:
        yield path, obj


def _norm(value: Any) -> str:
    """Numbers compare as numbers (loopd writes ``90``, a fold may hold ``90.0``)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = float(value)
    return json.dumps(value)


def _values(state: Any) -> set[str]:
    return {_norm(v) for _, v in _leaves(state)}


def _general(path: str) -> str:
    """``goals[2].config.checks[0]`` -> ``goals[].config.checks[]`` (how the report names fields)."""
    out, skipping = [], False
    for ch in path:
        if ch == "[":
            skipping = True
            out.append("[]")
        elif ch == "]":
            skipping = False
        elif not skipping:
            out.append(ch)
    return "".join(out)


def _reported(path: str, report: dict[str, str]) -> bool:
    """True when the field or a field above it is in the report."""
    probe = _general(path)
    while probe:
        if probe in report:
            return True
        cut = max(probe.rfind("."), probe.rfind("[]"))
        if cut <= 0:
            return False
        probe = probe[:cut]
    return False


def _scope(doc: dict[str, Any], path: str, import_id: str) -> str | None:
    """The stream whose folded state must show the field at ``path`` (None: anywhere in the log)."""
    head, _, rest = path.partition("[")
    if not rest:
        return f"import-{import_id}" if head in ("version", "revision") else None
    item = doc[head][int(rest.split("]", 1)[0])]
    return {
        "goals": lambda: f"goal-{item['id']}",
        "runtimes": lambda: f"goal-{item['goalID']}",
        "commands": lambda: f"command-{item['id']}",
        "commandAwaits": lambda: f"command-{item['commandID']}",
        "commandLedger": lambda: f"control-{item['requestID']}",
    }.get(head, lambda: None)()


def unaccounted(doc: dict[str, Any], states: dict[str, Any], report: dict[str, str]) -> list[str]:
    """The fields of ``doc`` neither found in their stream's folded state nor reported."""
    import_stream = next(s for s in states if s.startswith("import-"))
    everywhere = _values(states)
    scoped: dict[str, set[str]] = {}
    missing = []
    for path, value in _leaves(doc):
        if _reported(path, report):
            continue
        scope = _scope(doc, path, import_stream.removeprefix("import-"))
        if scope is None:
            found = _norm(value) in everywhere
        else:
            if scope not in scoped:
                scoped[scope] = _values(states.get(scope))
            found = _norm(value) in scoped[scope]
        if not found:
            missing.append(f"{path} = {value!r} (looked in {scope or 'every stream'})")
    return missing


@pytest.mark.parametrize("project", IMPORTABLE)
def test_every_state_field_is_kept_or_reported_with_its_reason(
    project: str, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = PROJECTS / project
    states = _import(capsys, url, directory)
    imported = next(v for k, v in states.items() if k.startswith("import-"))
    assert imported["completed"] and imported["migrated_version"] == 9
    report = {d["path"]: d["reason"] for d in imported["dropped_fields"]}
    assert not [p for p, reason in report.items() if reason == UNKNOWN], "classify them in importer/fields.py"
    assert all(len(reason) > 20 for reason in report.values())
    doc = json.loads((directory / ".opencode" / "loopd" / "state.json").read_text())
    assert unaccounted(doc, states, report) == []


def test_a_field_loopd_adds_later_is_reported_unknown_and_fails_the_walk(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    project = tmp_path / "p"
    shutil.copytree(EVERY, project)
    state_file = project / ".opencode" / "loopd" / "state.json"
    doc = json.loads(state_file.read_text())
    doc["goals"][0]["reviewQueue"] = {"owner": "ses_reviewer_7"}
    state_file.write_text(json.dumps(doc))
    url = f"sqlite:{tmp_path / 'log.db'}"
    out = _run(capsys, "--store", url, "import-loopd", str(project))
    assert f"goals[].reviewQueue: {UNKNOWN}" in out
    states: dict[str, Any] = json.loads(_run(capsys, "--store", url, "replay", "--json"))
    imported = next(v for k, v in states.items() if k.startswith("import-"))
    report = {d["path"]: d["reason"] for d in imported["dropped_fields"]}
    assert report["goals[].reviewQueue"] == UNKNOWN
    # reported, but only as unknown: without that entry the walk finds the value nowhere
    del report["goals[].reviewQueue"]
    assert unaccounted(doc, states, report) == [
        f"goals[0].reviewQueue.owner = 'ses_reviewer_7' (looked in goal-{DONE})"
    ]


def test_the_state_times_are_the_truth_not_the_ledger_lines(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each ledger line is stamped a few milliseconds after the state write it reports; state.json wins."""
    states = _import(capsys, url, EVERY)
    done, blocked = states[f"goal-{DONE}"], states[f"goal-{BLOCKED}"]
    assert done["created_at"] == "2026-11-26T08:00:00.111Z"  # its goal.created line says 08:00:01.300
    assert done["last_progress"]["at"] == "2026-11-26T08:38:12.345Z"  # line: 08:38:12.360
    assert done["completion_evidence"]["at"] == "2026-11-26T08:40:31.007Z"  # line: 08:40:31.021
    assert blocked["blocker"]["at"] == "2026-11-26T09:04:00.250Z"  # line: 09:04:00.266
    assert states[f"goal-{RUNNING}"]["last_progress"]["at"] == "2026-11-26T11:05:00.020Z"
    build = states["command-e2000000-0000-4000-8000-0000000000e1"]
    assert build["ended_at"] == "2026-11-26T08:21:00.000Z"  # line: 08:21:00.020


def test_the_runtime_bookkeeping_survives_the_import(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    states = _import(capsys, url, EVERY)
    done, running = states[f"goal-{DONE}"], states[f"goal-{RUNNING}"]
    attempts = [
        (a["attempt_id"], a["sequence"], a["status"], a["run_generation"])
        for a in done["verification_attempts"]
    ]
    assert attempts == [("att-1", 1, "failed", 1), ("att-2", 2, "passed", 2)]
    failed = done["verification_attempts"][0]
    assert failed["checks"] == [
        {
            "command": "bun test",
            "exit_code": 1,
            "stderr": "2 failing (parser.test.ts)",
            "stdout": "ran 40 tests",
        }
    ]
    assert (done["last_parent_notified_for"], done["last_compact_at"], done["last_schedule_at"]) == (
        "complete",
        "2026-11-26T08:33:00.000Z",
        "2026-11-26T08:40:31.000Z",
    )
    assert running["active_tool_call_ids"] == ["call_bench_1"]
    assert running["turn_started_at"] == "2026-11-26T11:01:00.007Z"


def test_a_goal_cleared_in_the_ledger_but_in_state_json_is_kept(tmp_path: Path) -> None:
    plan = build_plan(EVERY)
    assert plan.warnings == ()  # the importer's own comparison (times included) finds nothing
    assert [(k.line, k.type) for k in plan.skipped] == [(13, "goal.cleared")]
    assert "state.json has the goal again" in plan.skipped[0].reason
    types = [e.type for b in plan.batches if b.stream == f"goal-{BLOCKED}" for e in b.events]
    assert "goal.cleared" not in types and "goal.blocked" in types


def test_goal_show_shows_what_was_kept(url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _import(capsys, url, EVERY)
    read = ("--read-db", str(tmp_path / "read.db"))
    text = _run(capsys, "--store", url, "goal", "show", DONE, *read)
    assert "verification attempts (2):" in text and "att-1    1    1    failed" in text
    assert "notified    owner at 2026-11-26 08:40:32 (complete)" in text
    assert "schedule    runs 1   next 2026-11-26 09:40:31   last tick 2026-11-26 08:40:31" in text
    assert "compacted 2026-11-26 08:33:00" in text and "native parent ses_native_parent" in text
    doc = json.loads(_run(capsys, "--store", url, "goal", "show", RUNNING, "--json", *read))
    assert doc["kept"]["active_tool_call_ids"] == ["call_bench_1"]
    assert [(a["owner_session_id"], a["requested_at"]) for a in doc["awaits"]] == [
        ("ses_w_running", "2026-11-26T11:02:10.000Z")
    ]
    budget = json.loads(_run(capsys, "--store", url, "goal", "show", BUDGET, "--json", *read))
    assert [(r["run_id"], r["status"]) for r in budget["runs"]] == [
        ("run-c1", "completed"),
        ("run-c2", "budget_stopped"),
    ]


def test_the_source_and_migrated_versions_are_shown(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(capsys, "--store", url, "import-loopd", str(PROJECTS / "v2_project"))
    assert "synthesised from state.json version 2 (read as version 9)" in out
    assert "goals[].config.schedule: dropped by loopd's own v6 migration" in out
    summary = _run(capsys, "--store", url, "replay")
    assert "state.json v2 (read as v9), revision 40, completed" in summary


def test_a_torn_tail_is_reported_with_its_byte_offset(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    project = PROJECTS / "busy_day_torn_tail"
    ledger = (project / ".opencode" / "loopd" / "events.ndjson").read_bytes()
    offset = ledger.rindex(b"\n") + 1  # the torn line starts after the last newline
    out = _run(capsys, "--store", url, "import-loopd", str(project))
    assert f"line 59 at byte {offset}: an incomplete write at byte {offset}" in out
    states: dict[str, Any] = json.loads(_run(capsys, "--store", url, "replay", "--json"))
    imported = next(v for k, v in states.items() if k.startswith("import-"))
    assert [(k["line"], k["offset"]) for k in imported["skipped"] if k["offset"] is not None] == [
        (59, offset)
    ]
