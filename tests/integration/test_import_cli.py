"""``loopd-es import-loopd DIR`` end to end, in-process through ``main(*argv)``, on both log backends.

The log is inspected through the store API and ``loopd-es replay``; error cases check the exit code, the
message and that the log did not change.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import anyio
import pytest

from loopd_es.cli.main import main
from loopd_es.domain.evolve import fold, initial
from loopd_es.log import open_store

PROJECTS = Path(__file__).resolve().parents[1] / "fixtures" / "loopd_projects"
LIMIT = "21111111-aaaa-4bbb-8ccc-000000000002"
RUNNING = "31111111-aaaa-4bbb-8ccc-000000000003"


@pytest.fixture(params=["sqlite", "ndjson"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return (
        f"sqlite:{tmp_path / 'events.db'}"
        if request.param == "sqlite"
        else f"ndjson:{tmp_path / 'events.ndjson'}"
    )


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(*args)
    out, err = capsys.readouterr()
    return code, out, err


def _head(url: str) -> int:
    async def read() -> int:
        async with await open_store(url) as store:
            return await store.head()

    return anyio.run(read)


def test_import_replay_and_reimport(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    project = str(PROJECTS / "v9_project")
    code, out, err = _run(capsys, "--store", url, "import-loopd", project)
    assert code == 0, err
    assert "imported" in out and "7 goal(s), 4 command(s)" in out and err == ""
    assert "1 ledger line(s) not imported:\n  line 35 (command.exited): command " in out
    # the dev server's deadline (2026-11-20 10:34) passed after loopd's last write, long before today
    assert "settled 1 command(s) loopd had running: c2222222-aaaa-4bbb-8ccc-000000000002" in out
    assert "need reconciliation" not in out
    head = _head(url)
    assert head > 0

    code, out, err = _run(
        capsys, "--store", url, "replay", "--stream", f"goal-{LIMIT}", "--json", "--no-snapshots"
    )
    assert code == 0, err
    state = json.loads(out)
    assert (state["status"], state["blocker"]["kind"], state["run_count"]) == ("blocked", "provider-limit", 4)
    assert state["model_fallback"] == {"attempted": ["anthropic/claude-sonnet-4"], "status": "prepared"}
    assert state["anomaly_count"] == 0

    code, out, err = _run(capsys, "--store", url, "import-loopd", project)
    assert code == 0, err
    assert "already imported" in out and "nothing to add" in out
    assert _head(url) == head


def test_replay_folds_through_the_domain(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(capsys, "--store", url, "import-loopd", str(PROJECTS / "v9_project"))[0] == 0

    async def read() -> list[object]:
        async with await open_store(url) as store:
            return [env async for env in store.read_stream(f"goal-{RUNNING}")]

    envelopes = anyio.run(read)
    state = fold(envelopes, initial(RUNNING))  # type: ignore[arg-type]
    assert (state.status, state.phase, state.active_run_id, state.run_generation) == (
        "active",
        "running",
        "run-r2",
        7,
    )


def test_torn_ledger_warns_and_imports_the_rest(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "--store", url, "import-loopd", str(PROJECTS / "torn_ledger"))
    assert code == 0
    assert "warning:" in err and "line 4 is an incomplete write" in err
    assert "1 goal(s)" in out


def test_older_state_version_imports(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "--store", url, "import-loopd", str(PROJECTS / "v2_project"))
    assert code == 0, err
    assert "2 goal(s), 0 command(s)" in out and "0 from the ledger" in out


@pytest.mark.parametrize(
    ("project", "expected"),
    [
        ("corrupt_json", "not valid JSON"),
        ("wrong_shape", "Invalid enum value 'sleeping' - at `$.goals[0].status`"),
        ("unknown_version", "unknown state version 12"),
    ],
)
def test_corrupt_state_exits_2_and_changes_nothing(
    url: str, project: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(capsys, "--store", url, "import-loopd", str(PROJECTS / "torn_ledger"))[0] == 0
    head = _head(url)
    code, out, err = _run(capsys, "--store", url, "import-loopd", str(PROJECTS / project))
    assert code == 2 and out == ""
    assert (
        expected in err and f"{project}/.opencode/loopd/state.json" in err and "nothing was imported" in err
    )
    assert _head(url) == head


def test_corrupt_state_does_not_create_a_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:{tmp_path / 'new.db'}"
    code, _, err = _run(capsys, "--store", url, "import-loopd", str(PROJECTS / "corrupt_json"))
    assert code == 2 and "not valid JSON" in err
    assert not (tmp_path / "new.db").exists()


def test_missing_project_exits_2(url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "--store", url, "import-loopd", str(tmp_path / "nope"))
    assert code == 2 and "no such directory" in err


def test_a_changed_project_exits_3_and_changes_nothing(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    project = tmp_path / "p"
    shutil.copytree(PROJECTS / "torn_ledger", project)
    assert _run(capsys, "--store", url, "import-loopd", str(project))[0] == 0
    head = _head(url)
    state_file = project / ".opencode" / "loopd" / "state.json"
    doc = json.loads(state_file.read_text())
    doc["goals"][0]["name"] = "Renamed"
    state_file.write_text(json.dumps(doc))
    code, _, err = _run(capsys, "--store", url, "import-loopd", str(project))
    assert code == 3 and "already holds other events" in err
    assert _head(url) == head


def test_dry_run_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:{tmp_path / 'dry.db'}"
    code, out, _ = _run(capsys, "--store", url, "import-loopd", "--dry-run", str(PROJECTS / "v9_project"))
    assert code == 0 and "would import" in out and f"goal-{LIMIT}" in out
    assert not (tmp_path / "dry.db").exists()


def test_a_dry_run_says_what_a_real_run_would_do(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """On a log that holds the project it said "would import ... 15 events" where the import adds nothing;
    on a log that holds other events under the project's streams it now refuses as the import does."""
    project = str(PROJECTS / "v1_project")
    assert _run(capsys, "--store", url, "import-loopd", project)[0] == 0
    head = _head(url)
    code, out, _ = _run(capsys, "--store", url, "import-loopd", "--dry-run", project)
    assert code == 0 and "is already imported into" in out and "would import" not in out
    assert _head(url) == head


def test_deadlines_end_in_timeout_and_reconcile_settles_the_rest_missing(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A command loopd showed running past its deadline ends ``timeout``; ``--reconcile`` settles the others
    ``missing`` and fires their awaits once, to the session that asked."""
    tail, slow = "e2000000-0000-4000-8000-0000000000e2", "e2000000-0000-4000-8000-0000000000e3"
    bench = "e1000000-0000-4000-8000-0000000000d4"
    project = str(PROJECTS / "every_field")
    code, out, err = _run(capsys, "--store", url, "import-loopd", project)
    assert code == 0, err
    assert (
        f"need reconciliation (`loopd-es import-loopd --reconcile DIR` or `loopd-es cmd reconcile`): {tail}"
        in out
    )
    states = _replay(capsys, url)
    timed_out = states[f"command-{slow}"]  # deadline 11:03, loopd last wrote at 11:06
    assert (timed_out["status"], timed_out["end_reason"], timed_out["ended_at"]) == (
        "missing",
        "timeout",
        "2026-11-26T11:03:00.000Z",
    )
    waiting = states[f"command-{tail}"]
    assert waiting["status"] == "running"
    assert [(a["goal_id"], a["owner_session_id"], a["requested_at"]) for a in waiting["awaits"]] == [
        (bench, "ses_w_running", "2026-11-26T11:02:10.000Z")
    ]
    for _ in range(2):  # a second run finds it settled: nothing more
        code, out, err = _run(capsys, "--store", url, "import-loopd", "--reconcile", project)
        assert code == 0, err
        assert f"settled 1 command(s) loopd had running: {tail}" in out and "need reconciliation" not in out
    settled = _replay(capsys, url)[f"command-{tail}"]
    assert (settled["status"], settled["end_reason"], settled["awaits"]) == ("missing", "missing", [])
    assert [(a["owner_session_id"], a["outcome"]) for a in settled["past_awaits"]] == [
        ("ses_w_running", "command.await-fired")
    ]

    async def stream() -> list[str]:
        async with await open_store(url) as store:
            return [env.type async for env in store.read_stream(f"command-{tail}")]

    assert anyio.run(stream).count("command.await-fired") == 1


def _replay(capsys: pytest.CaptureFixture[str], url: str) -> dict[str, dict[str, Any]]:
    code, out, err = _run(capsys, "--store", url, "replay", "--json")
    assert code == 0, err
    states: dict[str, dict[str, Any]] = json.loads(out)
    return states
