"""An in-process CLI environment: a SQLite log and a simulated host with a given script, in a fresh directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest


def cli_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: dict[str, Any]) -> Path:
    """Point ``LOOPD_ES_STORE``/``LOOPD_ES_HOST`` at ``tmp_path`` (host scripted by ``script``) and go there."""
    (tmp_path / "host.json").write_text(json.dumps(script))
    for name, value in (
        ("LOOPD_ES_STORE", f"sqlite:{tmp_path / 'events.db'}"),
        ("LOOPD_ES_HOST", f"sim:{tmp_path / 'host.json'}"),
    ):
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    return tmp_path
