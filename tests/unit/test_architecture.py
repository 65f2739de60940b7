"""The layering rules of DESIGN.md, checked: the pure core does no I/O, and each OS edge has one owner."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import loopd_es

PACKAGE = Path(loopd_es.__file__).parent


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):  # imports only needed by the type checker are not dependencies
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = []
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            names.add("." * node.level + (node.module or ""))
    return names


def _modules(subpackage: str) -> list[Path]:
    return sorted((PACKAGE / subpackage).rglob("*.py"))


IO_MODULES = {"aiosqlite", "sqlite3", "watchfiles", "ptyprocess", "anyio", "subprocess", "socket"}


def test_events_and_domain_do_no_io() -> None:
    for sub in ("events", "domain"):
        for path in _modules(sub):
            bad = {name for name in _imports(path) if name.split(".")[0] in IO_MODULES}
            bad |= {
                name
                for name in _imports(path)
                if name.startswith("..") and name.lstrip(".").split(".")[0] in ("log", "projector", "procs", "cli")
            }
            assert not bad, f"{path.relative_to(PACKAGE)} imports {sorted(bad)}"


def test_each_os_edge_has_one_owner() -> None:
    owners = {"aiosqlite": "log", "watchfiles": "projector", "ptyprocess": "procs"}
    for path in PACKAGE.rglob("*.py"):
        top = path.relative_to(PACKAGE).parts[0]
        for name in _imports(path):
            owner = owners.get(name.split(".")[0])
            assert owner is None or top == owner, f"{path.relative_to(PACKAGE)} imports {name}; only {owner}/ may"


def test_public_api_matches_all() -> None:
    exported = {name for name in dir(loopd_es) if not name.startswith("_")} - {
        module.name for module in pkgutil.iter_modules(loopd_es.__path__)
    }
    assert isinstance(loopd_es.__all__, tuple)
    assert set(loopd_es.__all__) - {"__version__"} == exported - {"annotations"}


def test_every_module_imports() -> None:
    for info in pkgutil.walk_packages(loopd_es.__path__, "loopd_es."):
        if info.name.endswith("__main__"):
            continue
        importlib.import_module(info.name)


def test_only_the_cli_and_the_engine_itself_use_the_engine() -> None:
    """The engine wires everything below it; nothing below it may depend on it (no cycle through app)."""
    for path in PACKAGE.rglob("*.py"):
        top = path.relative_to(PACKAGE).parts[0]
        if top in ("engine", "cli"):
            continue
        for name in _imports(path):
            stripped = name.lstrip(".")
            assert not (stripped == "engine" or stripped.startswith("engine.") or name.startswith("loopd_es.engine")), (
                f"{path.relative_to(PACKAGE)} imports {name}; only cli/ may use the engine"
            )
