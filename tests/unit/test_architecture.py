"""The layering rules of DESIGN.md, checked on the import graph read from the source (AST, not runtime).

Every import statement of ``loopd_es/``, ``projections/`` and ``tools/`` counts: absolute and relative, at
module level or inside a function, and also those only the type checker sees (``if TYPE_CHECKING:``) for
the direction between packages, since a type-only import upwards is still the lower layer knowing about
the upper one. Dynamic imports (``importlib.import_module``) are allowed only inside their own package or
in the registry loaders. The rules, each failing with the offending file, line and statement:

* one direction between packages: a package imports only packages of a lower :data:`LAYERS` rank
  (events <- log, domain <- replay <- sagas <- app <- engine/cli/dash); ``projections`` use ``loopd_es``
  below the CLI, and ``loopd_es`` never imports ``projections`` (it loads them by name, via the registry);
* no cycle between packages, and none between files (runtime imports, lazy ones included);
* inside ``engine/`` and ``app/`` (:data:`PART_PACKAGES`), none between files even through type-only imports,
  and no function-local import of our modules (the way a cycle between files used to be hidden);
* each I/O dependency imported only where DESIGN.md says (:data:`OWNERS`).

:func:`test_the_checker_fails_on_a_back_import_and_a_cycle` runs the same checker on a small tree with a
deliberate back-import and a cycle, so the rules are seen to bite.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

import loopd_es

PACKAGE = Path(loopd_es.__file__).parent
ROOT = PACKAGE.parent
SCANNED = ("loopd_es", "projections", "tools")

LAYERS: dict[str, int] = {
    "errors": 0,
    "patterns": 0,  # user regexes on RE2; imports nothing of ours
    "text_safe": 0,  # the terminal sanitiser; imports nothing of ours
    "private_files": 0,  # .loopd/ 0700 and its files 0600; imports nothing of ours
    "version": 0,  # the installed version, from the package metadata
    "clock": 0,  # the one notion of time: the Clock protocol and every conversion; imports nothing of ours
    "ids": 1,  # the id shape and path builder; imports errors
    "events": 1,
    "log": 2,
    "domain": 2,
    "replay": 3,
    "procs": 3,
    "testing": 4,  # the log and host contract suites (and the memory backend) shipped for backend authors
    "projector": 3,
    "host": 3,  # the port and its hosts may read the domain's classifiers, never the sagas or the app
    "sagas": 4,
    "app": 5,
    "sched": 6,
    "postmortem": 6,
    "importer": 6,
    "projections": 6,
    "engine": 7,  # the daemon wires everything below it
    "cli": 8,  # `loopd-es run` starts the engine
    "dash": 7,  # a client of the read models and the log; the CLI starts it, and it runs CLI commands as processes
    "loopd_es": 9,  # the package root only re-exports; nothing inside imports it
    "__main__": 9,
    "tools": 10,  # scripts: may use anything, nothing imports them
}
"""Each package's rank: an import must go to a strictly lower rank (or stay in its own package). Packages of
one rank are independent of each other. A new package needs a rank here (DESIGN.md says where it goes)."""

OWNERS: dict[str, tuple[str, ...]] = {
    "aiosqlite": ("loopd_es.log", "loopd_es.log.*"),
    "watchfiles": ("loopd_es.projector", "loopd_es.projector.*"),
    "ptyprocess": ("loopd_es.procs", "loopd_es.procs.*"),
    "httpx": ("loopd_es.host.opencode*",),
    "h11": ("loopd_es.engine.tool_server",),
    "psycopg": ("loopd_es.log.postgres*",),
    "textual": ("loopd_es.dash", "loopd_es.dash.*"),
}
"""Third-party module -> the only modules (glob patterns) of ``loopd_es`` that may import it. ``tools/`` may also
use them directly: a benchmark measures the raw driver as the peer of the backend built on it."""

DYNAMIC_IMPORTERS = frozenset({"loopd_es.projector", "loopd_es.cli.postmortem_cmds"})
"""Modules that may import a module named at run time outside their own package: the registry loaders."""

KNOWN_VIOLATIONS: frozenset[tuple[str, str]] = frozenset()
"""(importing module, imported module) pairs tolerated for now; each must still break a rule (a stale entry fails).
Empty since branch ``domain`` gave the sagas a protocol of their own (the sagas -> app imports of #17.2)."""


@dataclass(frozen=True)
class Import:
    """One import edge: ``source`` imports ``target`` (a scanned module, or a third-party top-level name)."""

    source: str
    target: str
    path: str
    line: int
    statement: str
    type_only: bool
    ours: bool
    local: bool = False
    """Made inside a function (a lazy import), not at module level."""

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.statement}"


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(root: Path, tops: tuple[str, ...]) -> dict[str, Path]:
    return {
        _module_name(root, path): path
        for top in tops
        if (root / top).is_dir()
        for path in sorted((root / top).rglob("*.py"))
    }


def _is_type_checking(test: ast.expr) -> bool:
    return "TYPE_CHECKING" in ast.unparse(test)


def _dynamic_target(call: ast.Call, module: str, package: str) -> str | None:
    """``importlib.import_module(...)``: the module it names, ``"?"`` when it cannot be known statically."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    if name not in ("import_module", "__import__") or not call.args:
        return None
    arg = call.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values:  # f"{__name__}.x" / f"{__package__}.x": its own package
        first = arg.values[0]
        if isinstance(first, ast.FormattedValue) and isinstance(first.value, ast.Name):
            if first.value.id == "__name__":
                return module + ".*"
            if first.value.id == "__package__":
                return package + ".*"
    return "?"


class _FileScan:
    """The import edges out of one file."""

    def __init__(
        self, module: str, path: Path, root: Path, modules: dict[str, Path], tops: tuple[str, ...]
    ) -> None:
        self.module = module
        self.package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        self.rel = str(path.relative_to(root))
        self.modules = modules
        self.tops = tops
        self.edges: list[Import] = []
        self.local = False
        self.visit(ast.parse(path.read_text(), str(path)), type_only=False)

    def add(self, target: str, node: ast.Import | ast.ImportFrom | ast.Call, type_only: bool) -> None:
        ours = target.split(".")[0] in self.tops
        if ours:  # the longest scanned module the name starts with (``from x import name`` names x)
            while target not in self.modules and "." in target and not target.endswith(".*"):
                target = target.rpartition(".")[0]
        elif target != "?":
            target = target.split(".")[0]
        text = ast.unparse(node).splitlines()[0]
        self.edges.append(
            Import(
                self.module, target, self.rel, node.lineno, text, type_only, ours or target == "?", self.local
            )
        )

    def relative(self, node: ast.ImportFrom) -> str:
        base = self.package.split(".")
        if node.level > len(base):
            raise AssertionError(f"{self.rel}:{node.lineno}: relative import beyond the top package")
        base = base[: len(base) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))

    def visit(self, node: ast.AST, type_only: bool) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) and not self.local:
            self.local = True
            try:
                self.visit(node, type_only)
            finally:
                self.local = False
            return
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                self.visit(child, True)
            for child in node.orelse:
                self.visit(child, type_only)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                self.add(alias.name, node, type_only)
        elif isinstance(node, ast.ImportFrom):
            source = self.relative(node) if node.level else node.module or ""
            for alias in node.names:
                self.add(f"{source}.{alias.name}", node, type_only)
        elif isinstance(node, ast.Call):
            target = _dynamic_target(node, self.module, self.package)
            if target is not None:
                self.add(target, node, type_only)
        for inner in ast.iter_child_nodes(node):
            self.visit(inner, type_only)


def import_graph(root: Path, tops: tuple[str, ...] = SCANNED) -> tuple[dict[str, Path], list[Import]]:
    """Every module under ``root/<top>`` and every import edge out of them."""
    modules = _modules(root, tops)
    return modules, [
        edge
        for module, path in modules.items()
        for edge in _FileScan(module, path, root, modules, tops).edges
    ]


def package_of(module: str) -> str:
    """``loopd_es.log.sqlite`` -> ``log``; ``loopd_es`` -> ``loopd_es``; ``projections.goals`` -> ``projections``."""
    parts = module.split(".")
    if parts[0] == "loopd_es" and len(parts) > 1:
        return parts[1]
    return parts[0]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _module_key(name: str) -> str:
    return name


def _cycle_edges(component: list[str], edges: list[Import], key: Callable[[str], str]) -> list[str]:
    """The imports that make up a cycle: those between two members of ``component``."""
    members = set(component)
    return sorted(
        str(e)
        for e in edges
        if key(e.source) in members and key(e.target) in members and key(e.source) != key(e.target)
    )


def violations(
    root: Path,
    tops: tuple[str, ...] = SCANNED,
    layers: dict[str, int] = LAYERS,
    known: frozenset[tuple[str, str]] = frozenset(),
) -> list[str]:
    """Every broken rule under ``root``, one line each naming the import; ``known`` pairs are tolerated."""
    modules, edges = import_graph(root, tops)
    problems: list[str] = []
    used: set[tuple[str, str]] = set()
    for edge in edges:
        if not edge.ours:
            patterns = OWNERS.get(edge.target)
            allowed = (*patterns, "tools.*") if patterns is not None else ()
            if patterns is not None and not any(fnmatch(edge.source, p) for p in allowed):
                problems.append(f"{edge}: only {', '.join(patterns)} may import {edge.target}")
            continue
        if edge.target.endswith(".*"):  # a dynamic import inside the importer's own package
            continue
        if edge.target == "?":
            if edge.source not in DYNAMIC_IMPORTERS:
                problems.append(
                    f"{edge}: a dynamic import outside the registry loaders ({sorted(DYNAMIC_IMPORTERS)})"
                )
            continue
        src, dst = package_of(edge.source), package_of(edge.target)
        if src == dst:
            continue
        unranked = [pkg for pkg in (src, dst) if pkg not in layers]
        problems.extend(
            f"{edge}: package {pkg!r} has no rank in LAYERS (see DESIGN.md where it goes)" for pkg in unranked
        )
        if src in layers and dst in layers and layers[dst] >= layers[src]:
            if (edge.source, edge.target) in known:
                used.add((edge.source, edge.target))
                continue
            problems.append(
                f"{edge}: {src} (rank {layers[src]}) must not import {dst} (rank {layers[dst]}); "
                "imports go down the layers only"
            )
    runtime = [
        e
        for e in edges
        if e.ours and not e.type_only and e.target in modules and (e.source, e.target) not in known
    ]
    for key, label in ((package_of, "packages"), (_module_key, "files")):
        graph: dict[str, set[str]] = {}
        for edge in runtime:
            a, b = key(edge.source), key(edge.target)
            if a != b:
                graph.setdefault(a, set()).add(b)
        for component in _cycles(graph):
            through = "; ".join(_cycle_edges(component, runtime, key))
            problems.append(f"import cycle between {label} {' <-> '.join(component)}: {through}")
    stale = sorted(known - used)
    if stale:
        problems.append(f"KNOWN_VIOLATIONS lists imports that no longer break a rule (remove them): {stale}")
    return problems


PART_PACKAGES: tuple[str, ...] = ("engine", "app")
"""Packages built of parts that take narrow protocols (``engine/ports.py``, ``app/turns.py``'s
``PendingSwitches``) instead of the object that wires them: their files form no cycle even through type-only
imports, and they import our modules at module level only (a function-local import is how a cycle hides)."""


def part_violations(
    root: Path, tops: tuple[str, ...] = SCANNED, packages: tuple[str, ...] = PART_PACKAGES
) -> list[str]:
    """Cycles between files of one part package (type-only imports included) and function-local imports of
    our modules in those packages, one line each naming the imports."""
    modules, edges = import_graph(root, tops)
    ours = [e for e in edges if e.ours and e.target in modules and package_of(e.source) in packages]
    problems = [
        f"{e}: a function-local import in {package_of(e.source)}/; import at module level (a local import is how "
        "a cycle between files hides)"
        for e in ours
        if e.local
    ]
    inside = [e for e in ours if package_of(e.target) == package_of(e.source) and e.source != e.target]
    graph: dict[str, set[str]] = {}
    for edge in inside:
        graph.setdefault(edge.source, set()).add(edge.target)
    for component in _cycles(graph):
        through = "; ".join(dict.fromkeys(_cycle_edges(component, inside, _module_key)))
        problems.append(
            f"import cycle between files (type-only imports included) {' <-> '.join(component)}: {through}"
        )
    return list(dict.fromkeys(problems))  # one line per statement (``from x import a, b`` names two edges)


# -- the rules on this repository -------------------------------------------------------------------------


def test_layers_cycles_and_owners_hold_in_this_repository() -> None:
    problems = violations(ROOT, known=KNOWN_VIOLATIONS)
    assert not problems, "\n".join(problems)


def test_the_scan_sees_every_kind_of_import(tmp_path: Path) -> None:
    """The graph holds the edges a naive scan misses: absolute, ``from .. import x``, lazy, type-only, dynamic."""
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/log/__init__.py": "",
        "pkg/log/base.py": "",
        "pkg/app/__init__.py": "from .. import log\n",
        "pkg/app/run.py": (
            "from typing import TYPE_CHECKING\nimport pkg.log.base\nif TYPE_CHECKING:\n    from ..log import base\n"
            "def later() -> None:\n    from ..log.base import thing\n    import importlib\n"
            "    importlib.import_module('pkg.log')\n    importlib.import_module(name)\n"
        ),
        "scripts/bench.py": "from pkg.app import run\nimport anyio.to_thread\n",
    })  # fmt: skip
    _, edges = import_graph(tmp_path, ("pkg", "scripts"))
    found = {(e.source, e.target, e.line, e.type_only) for e in edges}
    assert found == {
        ("pkg.app", "pkg.log", 1, False),  # from .. import log (a package's __init__)
        ("pkg.app.run", "typing", 1, False),
        ("pkg.app.run", "pkg.log.base", 2, False),  # absolute
        ("pkg.app.run", "pkg.log.base", 4, True),  # under TYPE_CHECKING, relative
        ("pkg.app.run", "pkg.log.base", 6, False),  # inside a function, `from module import name`
        ("pkg.app.run", "importlib", 7, False),
        ("pkg.app.run", "pkg.log", 8, False),  # importlib.import_module with a literal
        ("pkg.app.run", "?", 9, False),  # ... and with a name known only at run time
        ("scripts.bench", "pkg.app.run", 1, False),  # from a second tree (tools/, projections/)
        ("scripts.bench", "anyio", 2, False),  # third-party: its top-level name
    }


def test_engine_and_app_parts_form_no_cycle_and_import_at_module_level() -> None:
    problems = part_violations(ROOT)
    assert not problems, "\n".join(problems)


def test_the_parts_check_fails_on_a_type_only_cycle_and_a_local_import(tmp_path: Path) -> None:
    """What the engine looked like before its parts took protocols: the core imports its parts, each part names
    the core for its type, and the goal use cases import the turn starter that names them back lazily."""
    _write(tmp_path, {
        "loopd_es/__init__.py": "", "loopd_es/engine/__init__.py": "", "loopd_es/app/__init__.py": "",
        "loopd_es/engine/core.py": "class Engine:\n    def __init__(self) -> None:\n        from .awaits import W\n",
        "loopd_es/engine/awaits.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .core import Engine\n",
        "loopd_es/app/goals.py": "from .turns import TurnStarter\n",
        "loopd_es/app/turns.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .goals import Goals\n",
        "loopd_es/domain/__init__.py": "",
        "loopd_es/domain/lazy.py": "def f() -> None:\n    from . import other\n",  # not a part package
        "loopd_es/domain/other.py": "",
    })  # fmt: skip
    problems = part_violations(tmp_path, tops=("loopd_es",))
    text = "\n".join(problems)
    assert "loopd_es/engine/core.py:3: from .awaits import W: a function-local import in engine/" in text
    assert any(
        p.startswith("import cycle between files (type-only imports included) loopd_es.engine.awaits <-> "
                     "loopd_es.engine.core") for p in problems
    ), text  # fmt: skip
    assert any(
        p.startswith("import cycle between files (type-only imports included) loopd_es.app.goals <-> "
                     "loopd_es.app.turns") and "loopd_es/app/turns.py:3: from .goals import Goals" in p
        for p in problems
    ), text  # fmt: skip
    assert len(problems) == 3, text
    # the runtime-only rule alone sees none of it: the cycles are type-only and the local import is lazy
    assert not [p for p in violations(tmp_path, tops=("loopd_es",)) if "cycle" in p]


def test_events_and_domain_do_no_io() -> None:
    io = {
        "aiosqlite",
        "sqlite3",
        "watchfiles",
        "ptyprocess",
        "anyio",
        "subprocess",
        "socket",
        "httpx",
        "psycopg",
    }
    _, edges = import_graph(ROOT)
    bad = [
        str(e)
        for e in edges
        if package_of(e.source) in ("events", "domain") and not e.ours and e.target in io
    ]
    assert not bad, "\n".join(bad)


# -- the checker bites: a small tree with a deliberate back-import and a cycle ---------------------------

_FIXTURE: dict[str, str] = {
    "loopd_es/__init__.py": "",
    "loopd_es/errors.py": "",
    "loopd_es/events/__init__.py": "from ..errors import *\n",
    "loopd_es/log/__init__.py": "from loopd_es.events import x\n",
    # the back-import: the vocabulary reaching up into the log, absolute and relative forms
    "loopd_es/events/goal.py": "def late() -> None:\n    from .. import log\n",
    "loopd_es/domain/__init__.py": "",
    # a cycle between two files of one package (no layering rule can see it)
    "loopd_es/domain/a.py": "from . import b\n",
    "loopd_es/domain/b.py": "import loopd_es.domain.a\n",
    # an OS edge owned elsewhere
    "loopd_es/domain/clock.py": "import aiosqlite\n",
    "projections/__init__.py": "",
    "projections/goals.py": "from loopd_es.domain import a\n",
    # the engine's side importing a concrete read model
    "loopd_es/log/registry.py": "from projections import goals\n",
}


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_checker_fails_on_a_back_import_and_a_cycle(tmp_path: Path) -> None:
    _write(tmp_path, _FIXTURE)
    problems = violations(tmp_path, tops=("loopd_es", "projections"))
    text = "\n".join(problems)
    # each names the file, the line and the statement
    assert (
        "loopd_es/events/goal.py:2: from .. import log: events (rank 1) must not import log (rank 2)" in text
    )
    assert (
        "loopd_es/log/registry.py:1: from projections import goals: log (rank 2) must not import projections"
        in text
    )
    assert (
        "loopd_es/domain/clock.py:1: import aiosqlite: only loopd_es.log, loopd_es.log.* may import aiosqlite"
        in text
    )
    assert any(
        p.startswith("import cycle between files loopd_es.domain.a <-> loopd_es.domain.b")
        and "loopd_es/domain/a.py:1: from . import b" in p
        and "loopd_es/domain/b.py:1: import loopd_es.domain.a" in p
        for p in problems
    ), text
    assert any(p.startswith("import cycle between packages events <-> log") for p in problems), text
    assert len(problems) == 5, text


def test_the_checker_passes_a_clean_tree_and_flags_stale_allowances(tmp_path: Path) -> None:
    clean = {k: v for k, v in _FIXTURE.items() if k not in ("loopd_es/events/goal.py", "loopd_es/domain/b.py",
                                                             "loopd_es/domain/clock.py", "loopd_es/log/registry.py")}  # fmt: skip
    _write(tmp_path, clean)
    assert violations(tmp_path, tops=("loopd_es", "projections")) == []
    stale = violations(
        tmp_path, tops=("loopd_es", "projections"), known=frozenset({("loopd_es.a", "loopd_es.b")})
    )
    assert stale == [
        "KNOWN_VIOLATIONS lists imports that no longer break a rule (remove them): [('loopd_es.a', 'loopd_es.b')]"
    ]


def test_an_unranked_package_and_an_unknown_dynamic_import_fail(tmp_path: Path) -> None:
    _write(tmp_path, {
        "loopd_es/__init__.py": "", "loopd_es/errors.py": "",
        "loopd_es/newpart/__init__.py": "from ..errors import E\n",
        "loopd_es/errors2.py": "import importlib\nimportlib.import_module(name)\n",
    })  # fmt: skip
    problems = violations(tmp_path, tops=("loopd_es",))
    assert any("package 'newpart' has no rank in LAYERS" in p for p in problems), problems
    assert any("errors2.py:2: importlib.import_module(name): a dynamic import outside" in p for p in problems)


# -- the package surface ------------------------------------------------------------------------------------


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
