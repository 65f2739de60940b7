"""``loopd-es engines`` reads each engine's status file: one folder per log, and only live engines."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from loopd_es.engine.status import EngineStatus, read_statuses, status_dir


def test_the_default_url_names_another_log_in_every_project(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sqlite:.loopd/events.db`` is a different log in each directory: their engines are not mixed up."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    here = EngineStatus("sqlite:.loopd/events.db", "engine-a")
    here.set("running", "holds the engine lease")
    assert [doc["holder"] for doc in read_statuses("sqlite:.loopd/events.db")] == ["engine-a"]
    assert status_dir(f"sqlite:{tmp_path / 'a' / '.loopd' / 'events.db'}") == here.path.parent  # same log
    monkeypatch.chdir(tmp_path / "b")
    assert read_statuses("sqlite:.loopd/events.db") == []
    here.remove()


def test_a_status_whose_pid_another_process_now_has_is_not_an_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine killed with -9 leaves its file; a later process with its pid is not that engine."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    url = f"sqlite:{tmp_path / 'events.db'}"
    status = EngineStatus(url, "engine")
    status.set("running")
    assert len(read_statuses(url)) == 1
    doc = json.loads(status.path.read_text())
    doc["started"] = "1"  # this pid's process started at another time: the file is a dead engine's
    status.path.write_text(json.dumps(doc))
    assert doc["pid"] == os.getpid() and read_statuses(url) == []
