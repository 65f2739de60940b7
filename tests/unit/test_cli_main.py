"""The CLI's dispatch table and its one-line error contract."""

from __future__ import annotations

import argparse
import importlib

import pytest

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
