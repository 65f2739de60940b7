"""The terminal's width for help texts, without the imports ``shutil.get_terminal_size`` brings along."""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing costs every start-up: mypy knows the name, and only annotations need it
if TYPE_CHECKING:
    import argparse  # not at run time: `--help` prints its kept text through columns() without argparse
    from collections.abc import Callable


def columns() -> int:
    """The terminal's width, found the way ``shutil.get_terminal_size`` finds it (``COLUMNS``, then standard
    output's terminal, else 80) without importing shutil (and with it bz2 and lzma)."""
    try:
        found = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        found = 0
    if found <= 0:
        try:
            found = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            found = 0
    return found if found > 0 else 80


def sized(formatter: type[argparse.HelpFormatter]) -> Callable[..., argparse.HelpFormatter]:
    """``formatter`` as wide as the terminal (:func:`columns`, which argparse would find through shutil,
    importing bz2 and lzma with it for every parser that formats an argument: a tenth of ``loopd-es --help``)."""

    def make(*, prog: str) -> argparse.HelpFormatter:  # argparse passes prog by keyword
        return formatter(prog, width=columns() - 2)  # argparse's own margin

    return make


def parent_parser() -> argparse.ArgumentParser:
    """A parser of options several commands share (``parents=[...]``), sized without shutil like the rest."""
    import argparse

    return argparse.ArgumentParser(add_help=False, formatter_class=sized(argparse.HelpFormatter))
