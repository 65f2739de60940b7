"""The ``loopd-es`` console script: ``loopd-es --help`` from its cache when one fits, anything else through the
command line parser (:mod:`.main`).

This module imports nothing but the standard library's cheapest modules, so the overview an agent asks for
first costs little more than starting Python; argparse, which the parser needs, costs as much again.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from typing import NoReturn

OVERVIEW_ARGS = (["--help"], ["-h"])
"""The command lines whose whole output is the overview help."""


def entry() -> NoReturn:
    """Console-script entry point. Ctrl-C at any moment, the imports included, exits 130 without a traceback."""
    try:
        code = _overview() if sys.argv[1:] in OVERVIEW_ARGS else None
        if code is None:
            from .main import main

            code = main()
    except KeyboardInterrupt:
        code = 130
    raise SystemExit(code)


def _overview() -> int:
    """Print the overview help: kept text when it fits this Python, width and build, else rendered by argparse
    (as ``loopd-es --help`` always did) and kept."""
    from .help_cache import cached_overview, keep_overview

    text = cached_overview()
    if text is None:
        from .main import overview_help

        text, keep = overview_help()
        if keep:
            keep_overview(text)
    sys.stdout.write(text)
    sys.stdout.flush()
    return 0
