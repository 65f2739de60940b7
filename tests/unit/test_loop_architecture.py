"""The pure half of ``loopd_es.sched`` does no I/O: deciders get the clock, the random draw and loop.md as facts."""

from __future__ import annotations

import ast
from pathlib import Path

import loopd_es

SCHED = Path(loopd_es.__file__).parent / "sched"
PURE = ("jitter", "grammar", "texts", "model", "decide", "due")
FORBIDDEN = {"anyio", "aiosqlite", "sqlite3", "subprocess", "socket", "os", "pathlib", "random", "time"}
FORBIDDEN_LOCAL = {"service", "runner", "goals", "tools"}


def test_pure_sched_modules_import_no_io() -> None:
    for name in PURE:
        tree = ast.parse((SCHED / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                bad = {a.name for a in node.names if a.name.split(".")[0] in FORBIDDEN}
            elif isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                top = mod.split(".")[0]
                bad = {mod} if (node.level == 0 and top in FORBIDDEN) else set()
                if node.level == 1 and top in FORBIDDEN_LOCAL:
                    bad.add(mod)
                if node.level == 2 and top in ("log", "host", "projector", "procs", "cli", "app", "sagas"):
                    bad.add(mod)
            else:
                continue
            assert not bad, f"sched/{name}.py imports {sorted(bad)}"
