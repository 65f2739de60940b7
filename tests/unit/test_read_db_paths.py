"""Each log has its own read database: two logs in one directory used to share ``read.db``, and the second
one's queries then failed (built from another log) until a rebuild, which broke the first one's."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopd_es.cli.main import main
from loopd_es.projector import default_read_db


def test_the_default_logs_keep_read_db_and_any_other_log_has_its_own() -> None:
    assert default_read_db("sqlite:.loopd/events.db") == Path(".loopd/read.db")
    assert default_read_db("ndjson:.loopd/events.ndjson") == Path(".loopd/read.db")
    assert default_read_db("sqlite:notes/a.db") == Path("notes/a.db.read.db")
    assert default_read_db("ndjson:notes/a.ndjson") == Path("notes/a.ndjson.read.db")


def test_two_logs_in_one_directory_query_side_by_side(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("a", "b"):
        url = f"sqlite:{tmp_path / name}.db"
        assert main("--store", url, "goal", "create", name, "--objective", "o", "--read-only") == 0
    for name in ("a", "b", "a"):
        capsys.readouterr()
        assert main("--store", f"sqlite:{tmp_path / name}.db", "goals") == 0
        out = capsys.readouterr().out
        assert f" {name} " in out and f" {'b' if name == 'a' else 'a'} " not in out, out
