"""CI checks types and lint before the tests, from a fresh machine, with CI=true."""

from __future__ import annotations

from pathlib import Path

CI = (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text()


def _at(command: str) -> int:
    lines = [n for n, line in enumerate(CI.splitlines()) if line.strip().startswith(command)]
    assert lines, f".ci/run does not run {command!r}"
    return lines[0]


def test_types_and_lint_run_before_the_tests() -> None:
    tests = _at("python3 -m pip install -e '.[test]' && python3 -m pytest")
    install = _at(
        "python3 -m pip install -q -e '.[test,lint,bench]'"
    )  # bench: mypy checks tools/ with their peer
    checks = [
        _at(c) for c in ("python3 -m mypy", "python3 -m ruff check .", "python3 -m ruff format --check .")
    ]
    assert install < min(checks) and max(checks) < tests


def test_ci_fails_on_the_first_error_and_sets_ci() -> None:
    assert "set -euo pipefail" in CI
    assert 'export CI="${CI:-true}"' in CI  # tests needing a missing real component then fail, not skip
