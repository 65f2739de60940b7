"""``loopd-es opencode install``: the command tools beside the others (the start tool asking for ``bash``), a config
naming a socket in a private directory rather than a port, and the token kept out of git."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from loopd_es.cli.main import main
from loopd_es.engine.command_tools import COMMAND_TOOLS
from loopd_es.engine.opencode_tools import render
from loopd_es.engine.tool_api import OWNER_TOOLS, TOOLS, WORKER_TOOLS


def test_install_writes_every_command_tool(tmp_path: Path) -> None:
    assert main("opencode", "install", str(tmp_path)) == 0
    written = {p.stem for p in (tmp_path / ".opencode" / "tool").glob("*.ts")}
    assert written == {spec.name for spec in (*WORKER_TOOLS, *OWNER_TOOLS)}
    assert {spec.name for spec in COMMAND_TOOLS} <= written
    start = (tmp_path / ".opencode" / "tool" / "loopd_command_start.ts").read_text()
    assert 'permission: "bash"' in start and "always: [args.command]" in start
    assert "env: tool.schema.record(tool.schema.string(), tool.schema.string()).optional()" in start
    assert '"loopd_command_start"' in start


def test_only_the_start_tool_asks_for_a_permission() -> None:
    asking = [spec.name for spec in TOOLS.values() if spec.asks is not None]
    assert asking == ["loopd_command_start"]
    assert "context.ask" not in render(TOOLS["loopd_command_get"])


def test_install_names_a_socket_not_a_port_and_keeps_the_config_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    project = tmp_path / "p"
    project.mkdir()
    assert main("opencode", "install", str(project)) == 0
    engine = project / ".opencode" / "loopd" / "engine.json"
    config = json.loads(engine.read_text())
    assert set(config) == {"socket", "token"} and len(config["token"]) >= 40
    assert Path(config["socket"]).parent.name == f"loopd-es-{os.getuid()}"
    assert stat.S_IMODE(engine.stat().st_mode) == 0o600
    tool = (project / ".opencode" / "tool" / "get_goal.ts").read_text()
    assert "unix: config.socket" in tool and "127.0.0.1" not in tool and "47321" not in tool
    assert "process.getuid()" in tool  # sends nothing to a socket directory someone else made
    again = tmp_path / "q"
    again.mkdir()
    assert main("opencode", "install", str(again)) == 0
    other = json.loads((again / ".opencode" / "loopd" / "engine.json").read_text())
    assert other["socket"] != config["socket"] and other["token"] != config["token"]


def test_install_prefers_the_runtime_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with tempfile.TemporaryDirectory(prefix="rt-") as runtime:  # short: tmp_path can be too long for a socket
        monkeypatch.setenv("XDG_RUNTIME_DIR", runtime)
        assert main("opencode", "install", str(tmp_path)) == 0
    config = json.loads((tmp_path / ".opencode" / "loopd" / "engine.json").read_text())
    assert Path(config["socket"]).parent == Path(runtime) / "loopd-es"


def test_a_socket_path_too_long_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path / ("x" * 90)))
    (tmp_path / ("x" * 90)).mkdir()
    monkeypatch.setattr("tempfile.tempdir", None)
    assert main("opencode", "install", str(tmp_path)) == 4
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "longer than 100 bytes" in err


def test_git_add_of_the_opencode_folder_leaves_the_token_out(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    gitignore = tmp_path / ".opencode" / "loopd" / ".gitignore"
    gitignore.parent.mkdir(parents=True)
    gitignore.write_text("state.json\n")  # a folder's own ignores are kept
    assert main("opencode", "install", str(tmp_path)) == 0
    assert main("opencode", "install", str(tmp_path)) == 0  # twice: one entry
    subprocess.run(["git", "-C", str(tmp_path), "add", ".opencode"], check=True)
    staged = subprocess.run(
        ["git", "-C", str(tmp_path), "diff", "--cached", "--name-only"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert ".opencode/tool/get_goal.ts" in staged
    assert not [name for name in staged if name.endswith("engine.json")]
    lines = gitignore.read_text().splitlines()
    assert lines[0] == "state.json" and lines.count("engine.json") == 1
