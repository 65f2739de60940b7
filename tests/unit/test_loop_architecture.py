"""The pure core of loops (``loopd_es.domain.loop``) does no I/O: the clock, the random draw and loop.md are facts."""

from __future__ import annotations

import ast
from pathlib import Path

import loopd_es

PURE = Path(loopd_es.__file__).parent / "domain" / "loop"
FORBIDDEN = {"anyio", "aiosqlite", "sqlite3", "subprocess", "socket", "os", "pathlib", "random", "time"}
FORBIDDEN_UP = {"log", "host", "projector", "procs", "cli", "app", "sagas", "sched", "replay"}


def test_pure_loop_modules_import_no_io() -> None:
    modules = sorted(PURE.glob("*.py"))
    assert {p.stem for p in modules} >= {"model", "decide", "jitter", "grammar", "texts", "due"}
    for path in modules:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                bad = {a.name for a in node.names if a.name.split(".")[0] in FORBIDDEN}
            elif isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                top = mod.split(".")[0]
                bad = {mod} if node.level == 0 and (top in FORBIDDEN or mod.startswith("loopd_es")) else set()
                if node.level == 3 and top in FORBIDDEN_UP:
                    bad.add(mod)
            else:
                continue
            assert not bad, f"domain/loop/{path.name} imports {sorted(bad)}"
