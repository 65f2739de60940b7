"""The console script's overview help: printed from its cache without argparse once rendered, and never stale.

Each test runs ``python -m loopd_es`` (the console script's entry) in a child process with its own
``XDG_CACHE_HOME``, so no test touches the user's cache.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import loopd_es
from loopd_es.cli.main import build_parser

ROOT = Path(loopd_es.__file__).resolve().parents[1]


def _help(
    cache: Path, *args: str, columns: int = 80, root: Path = ROOT, trace: bool = False
) -> tuple[str, str]:
    """``loopd-es --help``'s output, and its ``-X importtime`` trace when asked."""
    env = {**os.environ, "PYTHONPATH": str(root), "XDG_CACHE_HOME": str(cache), "COLUMNS": str(columns)}
    argv = [sys.executable, *(["-X", "importtime"] if trace else []), "-m", "loopd_es", *(args or ["--help"])]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, cwd=root, check=True)
    return done.stdout, done.stderr


def _rendered(columns: int, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("COLUMNS", str(columns))
    return build_parser(None, overview=True).format_help()


def _imports(trace: str) -> set[str]:
    return {line.split("|")[-1].strip() for line in trace.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize("columns", [60, 80, 140])
def test_the_overview_is_kept_and_printed_again_without_argparse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, columns: int
) -> None:
    first, trace = _help(tmp_path, columns=columns, trace=True)
    assert "argparse" in _imports(trace)  # rendered the first time
    assert first == _rendered(columns, monkeypatch)
    again, trace = _help(tmp_path, "-h", columns=columns, trace=True)
    assert again == first and "argparse" not in _imports(trace)
    assert [p.name.endswith(f"-{columns}.txt") for p in (tmp_path / "loopd-es").iterdir()] == [True]


def _help_before_and_after_an_edit(tmp_path: Path, source: str, old: str, new: str) -> tuple[str, str]:
    """The overview from a copy of the sources, then again after replacing ``old`` with ``new`` in ``source``
    (a path under loopd_es/cli); checks that one kept text is left, the new one."""
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "loopd_es", tree / "loopd_es", ignore=shutil.ignore_patterns("__pycache__"))
    cache = tmp_path / "cache"
    before, _ = _help(cache, root=tree)
    edited = tree / "loopd_es" / "cli" / source
    text = edited.read_text()
    assert old in text, f"{source} no longer says {old!r}: the test edits nothing"
    edited.write_text(text.replace(old, new))
    after, _ = _help(cache, root=tree)
    assert len(list((cache / "loopd-es").iterdir())) == 1
    return before, after


def test_a_changed_command_table_renders_the_overview_again(tmp_path: Path) -> None:
    """The file's name checksums the sources the text comes from: an upgrade or an edit is never shown stale,
    and the old text is removed when the new one is kept."""
    edit = ("main.py", '"append events to a stream"', '"append events, edited"')
    before, after = _help_before_and_after_an_edit(tmp_path, *edit)
    assert "append events, edited" in after and "append events, edited" not in before


def test_a_cache_that_cannot_be_written_is_no_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    out, err = _help(blocked)
    assert out == _rendered(80, monkeypatch) and err == ""
    assert _help(blocked)[0] == out


def test_a_changed_width_rule_renders_the_overview_again(tmp_path: Path) -> None:
    """The width the help is rendered at comes from cli/terminal.py, so its source is checksummed too."""
    before, after = _help_before_and_after_an_edit(tmp_path, "terminal.py", "columns() - 2", "columns() - 22")
    assert after != before and max(map(len, after.splitlines())) <= 80 - 22


@pytest.mark.parametrize("command", [["goals"], ["history", "g-1"], ["project"], ["read", "--limit", "1"]])
def test_a_command_builds_its_parser_without_shutil(tmp_path: Path, command: list[str]) -> None:
    """argparse finds the terminal's width through shutil, which imports bz2 and lzma: every parser here,
    shared option groups included, is sized by cli/terminal.py instead, so no command pays for them."""
    # -S: no site hooks (a .pth file may import what it likes at start-up); the packages found by path instead
    paths = [str(ROOT), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "XDG_CACHE_HOME": str(tmp_path)}
    argv = [
        sys.executable,
        "-S",
        "-X",
        "importtime",
        "-m",
        "loopd_es",
        "--store",
        f"sqlite:{tmp_path / 'none.db'}",
    ]
    done = subprocess.run(
        [*argv, *command], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path
    )
    assert "no log at" in done.stderr and done.returncode == 2, done.stderr[-500:]  # parsed, then ran
    assert _imports(done.stderr).isdisjoint({"shutil", "bz2", "lzma"}), command
