"""``loopd-es import-loopd DIR`` end to end, in-process through ``main(*argv)``, on both log backends.

The log is inspected through the store API and ``loopd-es replay``; error cases check the exit code, the
message and that the log did not change.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

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
    assert "need reconciliation (`loopd-es import-loopd --reconcile DIR`" in out
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


def test_reconcile_settles_what_loopd_had_running_and_fires_the_await_once(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The ci-watch command was running in loopd (its deadline has passed): timeout, and one await.fired."""
    ci_watch, flaky = "9c4d2e1f-3a5b-4c6d-8e7f-0000000000e2", "5e1f0a3c-7b2d-4c8e-9f10-0000000000c3"
    project = str(PROJECTS / "busy_day")
    code, out, err = _run(capsys, "--store", url, "import-loopd", project)
    assert code == 0, err
    assert (
        f"need reconciliation (`loopd-es import-loopd --reconcile DIR` or `loopd-es cmd reconcile`): {ci_watch}"
        in out
    )
    assert "5 ledger line(s) not imported:" in out and "  line 50 (run.recovered): goal " in out

    async def stream() -> list[tuple[str, dict[str, object]]]:
        async with await open_store(url) as store:
            return [(env.type, env.data_dict()) async for env in store.read_stream(f"command-{ci_watch}")]

    assert [t for t, _ in anyio.run(stream)][-1] == "command.watch-matched"  # imported as running
    for _ in range(2):  # a second run finds it settled: nothing more
        code, out, err = _run(capsys, "--store", url, "import-loopd", "--reconcile", project)
        assert code == 0, err
        assert (
            f"settled 1 command(s) loopd had running: {ci_watch}" in out and "need reconciliation" not in out
        )
    events = anyio.run(stream)
    exited = [d for t, d in events if t == "command.exited"]
    fired = [d for t, d in events if t == "command.await-fired"]
    assert [(d["status"], d["end_reason"]) for d in exited] == [("missing", "timeout")]
    assert [d["goal_id"] for d in fired] == [flaky]
