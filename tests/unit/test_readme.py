"""The README is executable documentation: its commands and its Python example must keep working."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from ..postgres_server import pg_url

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()

__all__ = ["pg_url"]


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


def _section_commands(heading: str) -> list[str]:
    """The lines of the first ```sh block under ``heading``, with ``loopd-es`` run from this interpreter."""
    section = README.split(f"\n{heading}\n", 1)[1]
    block = re.findall(r"```sh\n(.*?)```", section, flags=re.S)[0]
    program = f"{shlex.quote(sys.executable)} -m loopd_es"
    return [re.sub(r"(?<![\w-])loopd-es(?= )", program, line) for line in block.strip().splitlines()]


def _bash(lines: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``lines`` top to bottom as a reader pasting them would, stopping at the first failure."""
    env = {k: v for k, v in os.environ.items() if k != "LOOPD_ES_STORE"}
    script = "set -euo pipefail\n" + "\n".join(lines) + "\n"
    return subprocess.run(
        ["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=180
    )


def _read_json(cwd: Path, store: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-m", "loopd_es", "--store", store, "read", "--json"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_the_log_block_runs_top_to_bottom(tmp_path: Path) -> None:
    result = _bash(_section_commands("## The log"), tmp_path)
    assert result.returncode == 0, result.stderr
    original = _read_json(tmp_path, "sqlite:.loopd/events.db")
    assert len(original) == 2  # the appended event and the batch of one
    assert _read_json(tmp_path, "sqlite:restored.db") == original  # export, then import back: the same log


def test_the_postgresql_block_runs_top_to_bottom(tmp_path: Path, pg_url: str) -> None:
    lines = _section_commands("## One log for many machines: PostgreSQL")
    assert "--follow" in lines[-1], "the command that runs until stopped comes last"
    (url_line,) = [line for line in lines if line.startswith("export LOOPD_ES_STORE=")]
    lines[lines.index(url_line)] = f"export LOOPD_ES_STORE={shlex.quote(pg_url)}"
    # the block moves an existing log to the server: make one
    local = _bash(
        [f"{shlex.quote(sys.executable)} -m loopd_es append --stream goal-1 --type goal.nudged --data "
         """'{"goal_id": "goal-1"}'"""],
        tmp_path,
    )  # fmt: skip
    assert local.returncode == 0, local.stderr
    result = _bash(lines[:-1], tmp_path)
    assert result.returncode == 0, result.stderr
    on_server = [json.loads(line) for line in _read_json(tmp_path, pg_url)]
    assert [e["stream"] for e in on_server] == ["goal-1", "goal-7"]


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_readme_links_land() -> None:
    """Every ``#anchor`` of the README names one of its headings, and every relative link an existing file."""
    headings = {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", README, flags=re.M)}
    links = re.findall(r"\]\(([^)\s]+)\)", README)
    anchors = [link[1:] for link in links if link.startswith("#")]
    assert anchors and all(anchor in headings for anchor in anchors), set(anchors) - headings
    for link in links:
        if link.startswith(("#", "http://", "https://")):
            continue
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.exists(), link
        if anchor and target.suffix == ".md":
            text = target.read_text()
            slugs = {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}
            assert anchor in slugs | set(re.findall(r'<a id="([\w-]+)"></a>', text)), link
