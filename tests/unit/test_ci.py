"""CI checks types and lint before the tests, from a fresh machine, with CI=true."""

from __future__ import annotations

import ast
import os
import re
import shutil
import socket
import subprocess
import tempfile
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CI = (ROOT / ".ci" / "run").read_text()


def _at(command: str) -> int:
    lines = [n for n, line in enumerate(CI.splitlines()) if line.strip().startswith(command)]
    assert lines, f".ci/run does not run {command!r}"
    return lines[0]


def test_types_and_lint_run_before_the_tests() -> None:
    tests = _at(
        "python3 -m pip install --require-hashes -r requirements.lock && python3 -m pip install --no-deps"
    )
    install = _at("python3 -m pip install -q --require-hashes -r requirements.lock")
    project = _at("python3 -m pip install -q --no-deps -e .")
    checks = [
        _at(c) for c in ("python3 -m mypy", "python3 -m ruff check .", "python3 -m ruff format --check .")
    ]
    assert install < project < min(checks) and max(checks) < tests


def test_ci_installs_dependencies_only_from_the_lock() -> None:
    """Every pip install in CI either checks hashes against the lock or resolves nothing (--no-deps)."""
    for line in CI.splitlines():
        for install in re.findall(r"pip install ([^&]*)", line):
            if "--upgrade pip" in install:
                continue
            assert "--require-hashes -r requirements.lock" in install or "--no-deps" in install, line


def _locked() -> dict[str, tuple[str, list[str]]]:
    """requirements.lock as {name: (version, hashes)}."""
    from packaging.utils import canonicalize_name

    text = (ROOT / "requirements.lock").read_text().replace("\\\n", " ")
    pins: dict[str, tuple[str, list[str]]] = {}
    for line in text.splitlines():
        match = re.match(r"([A-Za-z0-9._-]+)==(\S+)(.*)", line)
        if match:
            pins[canonicalize_name(match[1])] = (
                match[2],
                re.findall(r"--hash=sha256:([0-9a-f]{64})", match[3]),
            )
    return pins


def _declared() -> list[str]:
    """Every requirement pyproject.toml declares: the dependencies and every extra (not loopd-es itself)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = [r for reqs in project["optional-dependencies"].values() for r in reqs]
    return [r for r in project["dependencies"] + extras if not r.startswith("loopd-es")]


def test_the_lock_pins_every_declared_requirement_with_hashes() -> None:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins = _locked()
    assert len(pins) > 20
    for name, (version, hashes) in pins.items():
        assert hashes, f"{name}=={version} has no hash in requirements.lock"
    for text in _declared():
        req = Requirement(text)
        name = canonicalize_name(req.name)
        assert name in pins, (
            f"{name} is declared in pyproject.toml but not locked: refresh the lock (AGENTS.md)"
        )
        assert req.specifier.contains(pins[name][0]), (
            f"locked {name}=={pins[name][0]} is outside {req.specifier}"
        )
        for extra in req.extras:  # psycopg[binary] brings psycopg-binary
            assert canonicalize_name(f"{req.name}-{extra}") in pins, text


def test_linters_are_pinned_exactly_and_textual_below_its_next_major() -> None:
    from packaging.requirements import Requirement

    declared = {Requirement(r).name: Requirement(r) for r in _declared()}
    for linter in ("mypy", "ruff"):
        (spec,) = declared[linter].specifier
        assert spec.operator == "==", f"{linter} must be pinned exactly, not {spec}"
    textual = declared["textual"].specifier
    locked_major = int(_locked()["textual"][0].split(".")[0])
    assert not textual.contains(f"{locked_major + 1}.0.0") and textual.contains(_locked()["textual"][0])


def test_ci_fails_on_the_first_error_and_sets_ci() -> None:
    assert "set -euo pipefail" in CI
    assert 'export CI="${CI:-true}"' in CI  # tests needing a missing real component then fail, not skip


def _setup_lines() -> list[str]:
    """The lines of .ci/run that run a setup script and export what it printed."""
    keep = ("tools/pg_test_server.sh start", "tools/opencode_setup.sh", "eval ")
    return [line for line in CI.splitlines() if any(k in line for k in keep) and not line.startswith("#")]


@pytest.mark.parametrize("failing", ["pg_test_server.sh", "opencode_setup.sh"])
def test_a_failed_setup_script_stops_ci(tmp_path: Path, failing: str) -> None:
    """The PostgreSQL start once failed (its port was taken) and CI ran on, every PostgreSQL test erroring."""
    tools = tmp_path / "tools"
    tools.mkdir()
    for name, var in (("pg_test_server.sh", "PG"), ("opencode_setup.sh", "OC")):
        body = "echo 'port taken' >&2; exit 1" if name == failing else f"echo 'export {var}=ok'"
        (tools / name).write_text(f"{body}\n")
    script = "set -euo pipefail\n" + "\n".join(_setup_lines()) + '\necho "reached $PG $OC"\n'
    result = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert result.returncode != 0 and "reached" not in result.stdout, result.stdout
    (tools / failing).write_text(f"echo 'export {'PG' if failing.startswith('pg') else 'OC'}=ok'\n")
    result = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert result.stdout.strip() == "reached ok ok", result.stderr


def _pg_dir() -> Path:
    """A cluster directory the 'postgres' user can reach (pytest's tmp_path is private to root)."""
    from tests.components import require

    require(
        list(Path("/usr/lib/postgresql").glob("*/bin/initdb")), "PostgreSQL", "apt-get install postgresql"
    )
    parent = Path(tempfile.mkdtemp(prefix="loopd-es-pgtest-"))
    parent.chmod(0o755)
    return parent / "pg"


def _pg_script(command: str, pg_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("LOOPD_ES_PG_")}
    environ.update(LOOPD_ES_PG_DIR=str(pg_dir), **env)
    return subprocess.run(
        ["bash", str(ROOT / "tools" / "pg_test_server.sh"), command],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_pg_script_starts_on_a_free_port_and_reuses_its_cluster() -> None:
    import psycopg

    pg_dir = _pg_dir()
    try:
        first = _pg_script("start", pg_dir)
        assert first.returncode == 0, first.stderr
        match = re.fullmatch(
            r"export LOOPD_ES_TEST_POSTGRES=(postgresql://postgres@127\.0\.0\.1:\d+/postgres)\n", first.stdout
        )
        assert match, first.stdout
        with psycopg.connect(match[1]) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        again = _pg_script("start", pg_dir)
        assert again.stdout == first.stdout, again.stderr
    finally:
        _pg_script("stop", pg_dir)
        shutil.rmtree(pg_dir.parent, ignore_errors=True)
    assert not pg_dir.exists()


@pytest.mark.slow
def test_pg_script_fails_when_its_port_is_taken() -> None:
    pg_dir = _pg_dir()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        try:
            result = _pg_script("start", pg_dir, LOOPD_ES_PG_PORT=str(port))
        finally:
            _pg_script("stop", pg_dir)
            shutil.rmtree(pg_dir.parent, ignore_errors=True)
    assert result.returncode != 0 and result.stdout == ""
    assert f"did not start on port {port}" in result.stderr


# Waiting and CI detection in test code (tests/waits.py, tests/components.py) -----------------------------------

_SLEEPS = frozenset({"sleep"})
_CLOCKS = frozenset({"monotonic", "perf_counter", "current_time", "time"})
_WAIT_HOME = ROOT / "tests" / "waits.py"
_CI_HOME = ROOT / "tests" / "components.py"


def _name(node: ast.expr) -> str:
    """The last name of a called thing: ``time.sleep`` -> ``sleep``."""
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _is_ci(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value == "CI"


def _reads_ci(node: ast.AST) -> bool:
    """``os.environ.get("CI")``, ``os.getenv("CI")``, ``os.environ["CI"]`` or ``"CI" in os.environ``."""
    if isinstance(node, ast.Call) and _name(node.func) in ("get", "getenv"):
        return bool(node.args) and _is_ci(node.args[0])
    if isinstance(node, ast.Subscript):
        return _is_ci(node.slice)
    if isinstance(node, ast.Compare):
        return _is_ci(node.left) and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops)
    return False


def _polls(loop: ast.While) -> bool:
    """A ``while`` loop that reads a clock: a deadline checked by hand around some waiting."""
    return any(isinstance(n, ast.Call) and _name(n.func) in _CLOCKS for n in ast.walk(loop))


def wait_problems(source: str, path: str, *, waits_home: bool = False, ci_home: bool = False) -> list[str]:
    """What ``source`` does that only tests/waits.py (waiting) or tests/components.py (deciding CI) may do.

    ``waits_home`` exempts from the sleep and poll-loop rules (tests/waits.py itself, and tools/, whose benchmarks
    measure elapsed time on purpose); ``ci_home`` from the CI rule.
    """
    problems = []
    for node in ast.walk(ast.parse(source)):
        where = f"{path}:{getattr(node, 'lineno', 0)}"
        if not waits_home and isinstance(node, ast.Call) and _name(node.func) in _SLEEPS:
            problems.append(
                f"{where}: sleeps; wait on a signal with wait_until, or let_time_pass(seconds, why)"
            )
        if not waits_home and isinstance(node, ast.While) and _polls(node):
            problems.append(f"{where}: a poll loop of its own; use tests.waits.wait_until / await_until")
        if not ci_home and _reads_ci(node):
            problems.append(f"{where}: decides CI by itself; use tests.components.under_ci()")
    return sorted(problems, key=lambda p: int(p.split(":")[1]))


def _checked_files() -> list[Path]:
    return sorted([*(ROOT / "tests").rglob("*.py"), *(ROOT / "tools").rglob("*.py")])


def test_no_test_sleeps_polls_or_decides_ci_by_itself() -> None:
    problems = []
    for path in _checked_files():
        problems += wait_problems(
            path.read_text(),
            str(path.relative_to(ROOT)),
            waits_home=path == _WAIT_HOME or path.is_relative_to(ROOT / "tools"),
            ci_home=path == _CI_HOME,
        )
    assert not problems, "\n".join(problems)


_FIXTURE = """
import os, time, anyio
from tests.waits import let_time_pass, wait_until

async def bad(ready):
    time.sleep(0.1)
    await anyio.sleep(0.1)
    deadline = time.monotonic() + 5
    while not ready() and time.monotonic() < deadline:
        pass
    return os.environ.get("CI") == "true" or "CI" in os.environ or os.getenv("CI")

def good(ready):
    let_time_pass(3.0, "the lease must expire")
    wait_until("ready", ready)
    script = "import time; time.sleep(60)"  # a child's body is text, not a call
    while ready():
        break
"""


def test_the_wait_check_finds_sleeps_poll_loops_and_ci_reads_in_a_fixture() -> None:
    found = wait_problems(_FIXTURE, "fixture.py")
    assert [p.split(": ", 1)[0] for p in found] == [
        "fixture.py:6",
        "fixture.py:7",
        "fixture.py:9",
        "fixture.py:11",
        "fixture.py:11",
        "fixture.py:11",
    ], found
    assert "sleeps" in found[0] and "poll loop" in found[2] and "decides CI" in found[3]
    assert wait_problems(_FIXTURE, "tests/waits.py", waits_home=True, ci_home=True) == []
