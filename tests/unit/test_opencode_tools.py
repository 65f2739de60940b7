"""``loopd-es opencode install`` writes the command tools beside the others, the start tool asking for ``bash``."""

from __future__ import annotations

import json
from pathlib import Path

from loopd_es.cli.main import main
from loopd_es.engine.command_tools import COMMAND_TOOLS
from loopd_es.engine.opencode_tools import render
from loopd_es.engine.tool_api import OWNER_TOOLS, TOOLS, WORKER_TOOLS


def test_install_writes_every_command_tool(tmp_path: Path) -> None:
    assert main("opencode", "install", str(tmp_path), "--port", "47999") == 0
    written = {p.stem for p in (tmp_path / ".opencode" / "tool").glob("*.ts")}
    assert written == {spec.name for spec in (*WORKER_TOOLS, *OWNER_TOOLS)}
    assert {spec.name for spec in COMMAND_TOOLS} <= written
    config = json.loads((tmp_path / ".opencode" / "loopd" / "engine.json").read_text())
    assert config["url"] == "http://127.0.0.1:47999"
    start = (tmp_path / ".opencode" / "tool" / "loopd_command_start.ts").read_text()
    assert 'permission: "bash"' in start and "always: [args.command]" in start
    assert "env: tool.schema.record(tool.schema.string(), tool.schema.string()).optional()" in start
    assert '"loopd_command_start"' in start


def test_only_the_start_tool_asks_for_a_permission() -> None:
    asking = [spec.name for spec in TOOLS.values() if spec.asks is not None]
    assert asking == ["loopd_command_start"]
    assert "context.ask" not in render(TOOLS["loopd_command_get"])
