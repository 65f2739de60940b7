"""``.loopd/`` and what loopd-es writes in it are private to the user on every backend: folders 0700, files 0600.

The CLI runs for real (in-process, umask 022 as on most systems): a goal is created on the simulated host and
the read models are built, then every file and folder under ``.loopd/`` is checked. The SQLite log's ``-wal``
and ``-shm`` files exist only while it is open, so they are checked on an open store.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from loopd_es.cli.main import main
from loopd_es.log import open_store
from loopd_es.testing import new

from ..postgres_server import pg_url
from ..waits import wait_until

__all__ = ["pg_url"]


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LOOPD_ES_HOST", raising=False)
    old = os.umask(0o022)
    try:
        yield tmp_path
    finally:
        os.umask(old)


def modes(root: Path) -> dict[str, int]:
    """Every folder and file under ``root`` (itself included) -> its permission bits."""
    found = {".": stat.S_IMODE(os.lstat(root).st_mode)}
    for path in root.rglob("*"):
        found[str(path.relative_to(root))] = stat.S_IMODE(os.lstat(path).st_mode)
    return found


def loose(root: Path) -> dict[str, str]:
    """What under ``root`` others could read: ``{path: mode}`` (empty when everything is private)."""
    return {
        name: f"{mode:04o}"
        for name, mode in modes(root).items()
        if mode & 0o077 or mode != (0o700 if (root / name).is_dir() else 0o600)
    }


def use_the_cli(store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPD_ES_STORE", store)
    assert main("goal", "create", "docs", "--objective", "write the guide, privately") == 0
    assert main("notifications") == 0  # builds the read database


@pytest.mark.parametrize("store", ["sqlite:.loopd/events.db", "ndjson:.loopd/events.ndjson"])
def test_a_file_log_and_the_host_state_are_private(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, store: str
) -> None:
    use_the_cli(store, monkeypatch)
    found = modes(workdir / ".loopd")
    assert {"host.state.json", "read.db"} <= set(found)
    assert any(name.startswith("events.") for name in found)
    assert loose(workdir / ".loopd") == {}


def test_a_commands_output_stays_private_past_its_cut(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Past 512 KiB a command's output log is cut to its tail; the rewritten file and the supervisor's log
    used to follow the umask (0644)."""
    monkeypatch.setenv("LOOPD_ES_STORE", "sqlite:.loopd/events.db")
    assert main("cmd", "start", "--title", "big", "--", "sh", "-c", "seq 1 200000") == 0  # about 1.3 MB

    def ended() -> bool:
        capsys.readouterr()
        main("cmd", "list", "--json")
        return '"status": "exited"' in capsys.readouterr().out

    wait_until("the command's exit", ended, within=60)
    logs = sorted(p.name for p in (workdir / ".loopd" / "commands").glob("*.log"))
    assert any(name.endswith(".supervisor.log") for name in logs) and len(logs) >= 2, logs
    assert loose(workdir / ".loopd") == {}


def test_a_server_log_keeps_its_local_files_private(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, pg_url: str
) -> None:
    use_the_cli(pg_url, monkeypatch)
    found = modes(workdir / ".loopd")
    assert "host.state.json" in found and any(name.startswith("read-") for name in found)
    assert loose(workdir / ".loopd") == {}


@pytest.mark.anyio
async def test_the_sqlite_side_files_are_private_while_the_log_is_open(workdir: Path) -> None:
    async with await open_store("sqlite:.loopd/events.db") as store:
        await store.append("s", [new()])
        names = {p.name for p in (workdir / ".loopd").iterdir()}
        assert {"events.db", "events.db-wal", "events.db-shm"} <= names
        assert loose(workdir / ".loopd") == {}


def test_an_older_readable_state_folder_is_tightened(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use_the_cli("sqlite:.loopd/events.db", monkeypatch)
    state = workdir / ".loopd"
    os.chmod(state, 0o755)
    for path in state.rglob("*"):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    assert loose(state)
    assert main("goal", "create", "more", "--objective", "again", "--read-only") == 0
    assert loose(state) == {}


def test_a_folder_named_by_the_user_is_left_as_it_is(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shared = workdir / "team"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    use_the_cli("sqlite:team/events.db", monkeypatch)
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755  # the user's folder: only what we create is private
    assert stat.S_IMODE((shared / "events.db").stat().st_mode) == 0o600
