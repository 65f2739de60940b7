"""Ids that could name a path outside the store are refused where they enter: CLI, importer, Python API."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import anyio
import pytest

from loopd_es.cli.main import main
from loopd_es.ids import InvalidIdError, check_id, is_valid_id, path_under
from loopd_es.importer import build_plan
from loopd_es.importer.source import ImportSourceError
from loopd_es.log import open_store
from loopd_es.procs import service
from loopd_es.procs.paths import CommandPaths

PROJECTS = Path(__file__).resolve().parents[1] / "fixtures" / "loopd_projects"
TRAVERSAL = "../../../../../../victim"


@pytest.mark.parametrize(
    "bad",
    [
        "",
        ".",
        "..",
        "../x",
        "a/b",
        "/etc/passwd",
        "-rf",
        ".hidden",
        "a\x00b",
        "a b",
        "a\nb",
        "\x1b[2J",
        "é",
        "x" * 129,
    ],
)
def test_bad_ids_are_refused(bad: str) -> None:
    assert not is_valid_id(bad)
    with pytest.raises(InvalidIdError) as e:
        check_id("command", bad)
    assert "\n" not in str(e.value) and "\x1b" not in str(e.value) and "\x00" not in str(e.value)


@pytest.mark.parametrize(
    "good", ["g1", "goal-7", "c1222222-aaaa-4bbb-8ccc-000000000001", "a..b", "A_b.c", "x" * 128]
)
def test_good_ids_pass(good: str) -> None:
    assert check_id("goal", good) == good


def test_path_under_keeps_every_path_directly_under_its_root(tmp_path: Path) -> None:
    assert path_under(tmp_path, "command", "abc", ".log") == tmp_path / "abc.log"
    for bad in ("..", "../x", "a/../../x"):
        with pytest.raises(InvalidIdError):
            path_under(tmp_path, "command", bad, ".log")
    with pytest.raises(InvalidIdError):
        path_under(tmp_path, "command", "abc", "/../../x")


def test_command_paths_refuse_traversal(tmp_path: Path) -> None:
    paths = CommandPaths(f"sqlite:{tmp_path / 'a' / 'ev.db'}")
    for build in (paths.log, paths.lock, paths.supervisor_log, paths.socket):
        with pytest.raises(InvalidIdError):
            build(TRAVERSAL)


def _hostile_project(tmp_path: Path, command_id: str) -> Path:
    """A loopd project whose only command has ``command_id`` (otherwise the v9 fixture's first command)."""
    state = json.loads((PROJECTS / "v9_project" / ".opencode" / "loopd" / "state.json").read_text())
    cmd = dict(state["commands"][0], id=command_id)
    doc = {
        "version": 9,
        "revision": 1,
        "goals": [],
        "runtimes": [],
        "commandLedger": [],
        "commands": [cmd],
        "commandAwaits": [],
    }
    base = tmp_path / "proj" / ".opencode" / "loopd"
    base.mkdir(parents=True)
    (base / "state.json").write_text(json.dumps(doc))
    (base / "events.ndjson").write_text("")
    return tmp_path / "proj"


def test_import_refuses_a_traversal_command_id_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reported attack: import, then ``cmd read``/``cmd remove`` of the id reached a file outside the store."""
    project = _hostile_project(tmp_path, TRAVERSAL)
    with pytest.raises(ImportSourceError, match=r"commands\[0\]\.id: invalid command id"):
        build_plan(project)
    store = tmp_path / "store" / "a" / "b"
    (store / "commands").mkdir(parents=True)
    victim = tmp_path / "victim.log"
    victim.write_text("SECRET\n")
    url = f"sqlite:{store / 'events.db'}"
    capsys.readouterr()
    assert main("--store", url, "import-loopd", str(project)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid command id" in err and "nothing was imported" in err
    assert not (store / "events.db").exists()
    for verb in ("read", "remove", "show", "terminate"):
        assert main("--store", url, "cmd", verb, TRAVERSAL) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "invalid command id" in err, err
    assert victim.read_text() == "SECRET\n"


def test_ledger_ids_are_checked_too(tmp_path: Path) -> None:
    project = tmp_path / "p"
    shutil.copytree(PROJECTS / "v9_project", project)
    ledger = project / ".opencode" / "loopd" / "events.ndjson"
    lines = ledger.read_text().splitlines()
    first = json.loads(lines[0])
    first["goalID"] = "../goal"
    ledger.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    with pytest.raises(ImportSourceError, match=r"line 1 goalID: invalid goal id '\.\./goal'"):
        build_plan(project)


def test_api_refuses_bad_ids_and_skips_hand_appended_streams(tmp_path: Path) -> None:
    """``resolve_id`` checks its input; a ``command-<bad>`` stream appended by hand is never made a path."""
    url = f"sqlite:{tmp_path / 'ev.db'}"
    victim = tmp_path / "victim.lock"

    bad = "abcd/../../victim"
    code = main(
        "--store",
        url,
        "append",
        "--stream",
        f"command-{bad}",
        "--type",
        "command.started",
        "--data",
        json.dumps(
            {
                "command_id": bad,
                "title": "t",
                "command": "c",
                "cwd": "/",
                "started_at": "2026-12-02T12:00:00Z",
            }
        ),
    )
    assert code == 0
    (tmp_path / "commands").mkdir()

    async def go() -> None:
        async with await open_store(url) as store:
            with pytest.raises(InvalidIdError):
                await service.resolve_id(store, "../victim")
            assert [s.id for s in await service.list_states(store)] == []
            with pytest.raises(Exception, match="Command not found"):
                await service.resolve_id(store, "abcd")
            assert await service.reconcile(store, CommandPaths(url)) == 0

    anyio.run(go)
    assert not victim.exists()


def test_goal_api_refuses_an_id_that_would_name_another_directory(tmp_path: Path) -> None:
    """A goal id becomes its artifact directory (``.opencode/loopd/goals/<id>``, the checks' cwd)."""
    from loopd_es.app.goals import Goals
    from loopd_es.app.service import Ctx, GoalService
    from loopd_es.host import open_host

    async def go() -> None:
        async with await open_store(f"sqlite:{tmp_path / 'ev.db'}") as store:
            host = await open_host(f"sim:{tmp_path / 'host.json'}")
            try:
                goals = Goals(GoalService(store, host))
                with pytest.raises(InvalidIdError, match="invalid goal id '../../../etc'"):
                    await goals.create("n", "o", Ctx.new(), goal_id="../../../etc")
                assert await store.head() == 0
            finally:
                await host.aclose()

    anyio.run(go)


@pytest.mark.parametrize(
    "stream", ["../../escaped", "..", ".", "/etc/x", "a/../../b", "goal-\x00x", "%2e%2e%2Fx"]
)
def test_snapshot_files_of_any_stream_name_stay_in_their_directory(tmp_path: Path, stream: str) -> None:
    """Stream names are not checked against the id shape (any log may hold any); snapshot names are quoted."""
    from loopd_es.replay.snapshots import SnapshotStore

    snaps = SnapshotStore(tmp_path / "snaps", {"goal": 1})
    snaps.save(stream, 1, 1, "2026-12-02T00:00:00Z", {"x": 1})
    assert snaps.load(stream) is not None
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(files) == 1 and files[0].parent == snaps.dir
