"""``sagas/`` never imports ``app/`` (#17.2): the goal service reaches the sagas through ``sagas.ports``."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import TYPE_CHECKING

import loopd_es
from loopd_es.app.service import GoalService

if TYPE_CHECKING:
    from loopd_es.sagas.ports import GoalPort

SAGAS = Path(loopd_es.__file__).parent / "sagas"


def _imports(path: Path) -> list[str]:
    """Every module ``path`` imports, absolute, including relative and ``TYPE_CHECKING`` imports."""
    package = ["loopd_es", "sagas"]
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            found.append(module)
            found += [f"{module}.{alias.name}" for alias in node.names]
    return found


def test_no_saga_module_imports_the_app_layer() -> None:
    offenders = [
        f"{path.name}: {name}"
        for path in sorted(SAGAS.glob("*.py"))
        for name in _imports(path)
        if name == "loopd_es.app" or name.startswith("loopd_es.app.")
    ]
    assert offenders == []


def test_the_relative_resolution_sees_a_back_import(tmp_path: Path) -> None:
    """The scan above is not vacuous: ``from ..app.service import Ctx`` in a saga module resolves to ``app``."""
    fake = tmp_path / "x.py"
    fake.write_text("from ..app.service import Ctx\nfrom .ports import GoalPort\n")
    assert "loopd_es.app.service.Ctx" in _imports(fake) and "loopd_es.sagas.ports" in _imports(fake)


def as_port(service: GoalService) -> GoalPort:
    """mypy (strict, over tests too) checks that the goal service satisfies the sagas' port."""
    return service


def test_the_goal_service_has_what_the_port_names() -> None:
    assert all(callable(getattr(GoalService, name)) for name in ("load", "execute", "append"))
