"""The README is executable documentation: its commands and its Python example must keep working."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def test_first_screen_has_exactly_two_setup_commands() -> None:
    first_screen = README.split("---", 1)[0]
    commands = re.findall(r"```sh\n(.*?)```", first_screen, flags=re.S)
    assert len(commands) == 2
    assert "pip install" in commands[0] and "loopd-es" in commands[0]
    assert "pip install" in commands[1] and "pytest" in commands[1]


def test_ci_runs_the_readme_test_command() -> None:
    first_screen = README.split("---", 1)[0]
    test_command = re.findall(r"```sh\n(.*?)```", first_screen, flags=re.S)[1].strip()
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_command in ci


def test_main_command_runs_on_a_fresh_directory(tmp_path: Path) -> None:
    first_screen = README.split("---", 1)[0]
    main_command = re.findall(r"```sh\n(.*?)```", first_screen, flags=re.S)[0].strip()
    runnable = main_command.split("&&", 1)[1].strip()  # the install step already happened for the tests
    runnable = runnable.replace("loopd-es", f"{sys.executable} -m loopd_es")
    result = subprocess.run(runnable, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "loopd-demo" / "events.db").exists()
    assert "Identity switch: deferred" in result.stdout


def test_python_example_runs(tmp_path: Path) -> None:
    (example,) = _blocks("py")
    result = subprocess.run(
        [sys.executable, "-c", example], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "goal.nudged" in result.stdout
