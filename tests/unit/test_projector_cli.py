"""``loopd-es project`` and ``loopd-es projections status | retry | rebuild``, run in-process."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from loopd_es.cli import main as cli
from loopd_es.cli import projector_cmds
from loopd_es.log import open_store

from .test_projector_base import Picky, dump, fill

REGISTRY = ["--registry", "tests.unit.test_projector_base"]


@pytest.fixture(autouse=True)
def with_projector_commands(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A clean environment for the projector commands."""
    assert cli.COMMAND_MODULES["project"] == projector_cmds.__name__.rsplit(".", 1)[-1]
    monkeypatch.delenv(cli.STORE_ENV, raising=False)
    Picky.allow = False
    yield
    Picky.allow = False


@pytest.fixture
def log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A SQLite log at the default place, ``.loopd/events.db``, with 300 events (3 of them bad for Picky)."""
    monkeypatch.chdir(tmp_path)

    async def make() -> None:
        async with await open_store("sqlite:.loopd/events.db") as store:
            await fill(store, 300, bad_every=100)

    anyio.run(make)
    return tmp_path / ".loopd" / "events.db"


def test_project_then_status_retry_and_rebuild(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    read_db = log.parent / "read.db"
    assert cli.main("project", *REGISTRY) == 0
    assert "applied" in capsys.readouterr().out and read_db.exists()  # the default: read.db beside the log

    assert cli.main("projections", "status", "--json", *REGISTRY) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["head"] == 300 and status["read_db"] == ".loopd/read.db"
    assert [(p["name"], p["position"], p["lag"], p["parked"]) for p in status["projections"]] == [
        ("stream_stats", 300, 0, 0),
        ("recorder", 300, 0, 0),
        ("picky", 300, 0, 3),
    ]
    assert cli.main("projections", "status", *REGISTRY) == 0
    table = capsys.readouterr().out
    assert "picky" in table and "last parked: ValueError: refusing bad event at 300" in table

    assert cli.main("projections", "retry", *REGISTRY) == 3  # the cause is still there
    assert "0 parked event(s); 3 still parked" in capsys.readouterr().out
    Picky.allow = True
    assert cli.main("projections", "retry", "picky", *REGISTRY) == 0
    assert dump(read_db)["parked"] == []

    built = dump(read_db)
    assert cli.main("projections", "rebuild", "stream_stats", *REGISTRY) == 0
    assert "rebuilt stream_stats from 300 event(s)" in capsys.readouterr().out
    assert dump(read_db) == built


def test_an_explicit_read_db_and_the_default_registry(log: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "other" / "models.db"
    assert cli.main("project", "--read-db", str(elsewhere)) == 0
    assert list(dump(elsewhere)) == ["stream_stats", "parked"]
    assert sum(row[2] for row in dump(elsewhere)["stream_stats"]) == 300


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["projections", "rebuild", "nope"], 2, "unknown projection 'nope'"),
        (["project", "--poll", "0"], 2, "must be > 0"),
        (["project", "--registry", "no_such_module"], 2, "cannot import the projection registry"),
        (["project", "--registry", ""], 2, "cannot import the projection registry"),  # was an internal error
        (["projections"], 2, "required"),
        (["--store", "sqlite:missing/events.db", "project"], 2, "no log at missing/events.db"),
    ],
)
def test_usage_errors_exit_2_with_one_line(
    log: Path, capsys: pytest.CaptureFixture[str], argv: list[str], code: int, message: str
) -> None:
    assert cli.main(*argv) == code
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_rebuild_starts_a_damaged_read_db_afresh(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The error of a damaged read database recommends ``projections rebuild``, which failed with the same
    error; it now starts the (disposable) database afresh and rebuilds it."""
    assert cli.main("project") == 0
    read_db = Path(".loopd/read.db")
    with read_db.open("r+b") as f:
        f.seek(4096)
        f.write(b"\xde\xad" * 2048)
    capsys.readouterr()
    assert cli.main("goals") == 4
    assert "projections rebuild" in capsys.readouterr().err
    assert cli.main("projections", "rebuild") == 0
    captured = capsys.readouterr()
    assert "was damaged" in captured.err and captured.out.startswith("rebuilt ")
    assert cli.main("goals") == 0
