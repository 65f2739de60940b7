"""The CLI's dispatch table and its one-line error contract."""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

import loopd_es
from loopd_es.cli.main import COMMAND_MODULES, _command_of, build_parser, main


def test_every_command_is_dispatched_to_the_module_that_defines_it() -> None:
    for name in set(COMMAND_MODULES.values()):
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers()
        importlib.import_module(f"loopd_es.cli.{name}").register(sub)
        for command in sub.choices:
            assert COMMAND_MODULES.get(command) in (name, "saga_cmds"), f"{command} is defined in {name}"
    full = build_parser()
    commands = next(a for a in full._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(commands) == set(COMMAND_MODULES)


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["read"], "read"),
        (["--store", "sqlite:x.db", "goal", "show", "g"], "goal"),
        (["--verbose", "--store=ndjson:x", "history", "g"], "history"),
        (["--help"], None),
        ([], None),
    ],
)
def test_the_command_word_is_found_past_global_options(argv: list[str], command: str | None) -> None:
    assert _command_of(argv) == command


def test_an_unknown_command_is_a_usage_error_listing_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main("frobnicate") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid choice" in err and "append" in err


def _parsers(
    parser: argparse.ArgumentParser, path: str = "loopd-es"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every parser of the command tree with its command line, subcommands included."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def test_every_command_says_what_it_does_and_names_its_subcommands_one_way() -> None:
    tree = list(_parsers(build_parser()))
    assert len(tree) > 60
    for path, parser in tree:
        assert parser.description, f"`{path} --help` has no description"
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                assert action.metavar == ("COMMAND" if path == "loopd-es" else "ACTION"), path
                listed = {a.dest: a.help for a in action._choices_actions}
                assert all(listed.get(name) for name in action.choices), f"{path}: a subcommand has no help"


def test_the_help_names_every_kind_of_store_and_host(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--help"], ["models", "--help"]):
        with pytest.raises(SystemExit):  # argparse prints the help and exits
            main(*argv)
    out = " ".join(capsys.readouterr().out.split())
    for kind in (
        "sqlite:PATH",
        "ndjson:PATH",
        "postgresql://",
        "memory:NAME",
        "sim:FILE",
        "opencode:http://",
    ):
        assert kind in out


def test_version_comes_from_the_installed_metadata(capsys: pytest.CaptureFixture[str]) -> None:
    assert main("--version") == 0
    assert capsys.readouterr().out == f"loopd-es {metadata.version('loopd-es')}\n"
    assert loopd_es.__version__ == metadata.version("loopd-es")


@pytest.mark.parametrize(
    ("argv", "key"),
    [(["goals"], "goals"), (["commands"], "commands"), (["cmd", "list"], "commands"), (["loops"], "loops")],
)
def test_every_list_answers_one_object_with_a_named_list(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    key: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    store = f"sqlite:{tmp_path / 'events.db'}"
    assert main("--store", store, "goal", "create", "docs", "--objective", "write the docs") == 0
    capsys.readouterr()
    assert main("--store", store, *argv, "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert list(doc) == [key] and isinstance(doc[key], list)
    assert len(doc[key]) == (1 if key == "goals" else 0)


def test_help_imports_neither_typing_nor_shutil() -> None:
    """A third of ``--help``'s start-up was typing (annotations only) and shutil (argparse's terminal width, with
    bz2 and lzma): neither is loaded. ``-S`` keeps site's own imports (``.pth`` files) out of the count."""
    script = (
        "import sys\n"
        "from loopd_es.cli.main import main\n"
        "try:\n    main('--help')\nexcept SystemExit as e:\n    code = e.code\n"
        "print('LOADED', [m for m in ('typing', 'shutil', 'asyncio') if m in sys.modules], code, file=sys.stderr)\n"
    )
    root = str(Path(loopd_es.__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, "-S", "-c", script], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": root, "COLUMNS": "77"}, check=True)  # fmt: skip
    assert done.stderr.strip().splitlines()[-1] == "LOADED [] 0", done.stderr
    assert "usage: loopd-es" in done.stdout
    assert max(len(line) for line in done.stdout.splitlines()) <= 75  # COLUMNS, less argparse's margin


@pytest.mark.parametrize("where", ["build_parser", "_not_utf8"])
def test_ctrl_c_before_the_command_runs_ends_with_130_and_no_traceback(
    where: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C while the parser is built or the arguments are checked (before the command's own handling)."""

    def interrupted(*_args: object, **_kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(f"loopd_es.cli.main.{where}", interrupted)
    assert main("goals") == 130
    assert capsys.readouterr().err == ""
