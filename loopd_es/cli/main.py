"""``loopd-es [--store URL] COMMAND ...``: parse, run the command's coroutine with anyio, map errors to exit codes.

Every command group lives in its own module and exposes ``register(subparsers)``; each parser sets
``handler`` (an ``async def (args) -> int``) with ``set_defaults``. Errors derived from
:class:`~loopd_es.errors.LoopdError` print as one line on stderr and exit with their family's code.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import NoReturn

import anyio

from ..errors import EXIT_INTERNAL, EXIT_USAGE, LoopdError

DEFAULT_STORE = "sqlite:.loopd/events.db"
STORE_ENV = "LOOPD_ES_STORE"

Handler = Callable[[argparse.Namespace], Awaitable[int]]


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so usage errors get our one-line format and exit code 2."""

    def error(self, message: str) -> NoReturn:
        raise _UsageExit(f"{self.prog}: {message} (see `{self.prog} --help`)")


class _UsageExit(Exception):
    pass


def build_parser() -> argparse.ArgumentParser:
    """The whole command tree; each command module adds its own subcommands."""
    from . import log_cmds

    parser = _Parser(
        prog="loopd-es",
        description="An event-sourced engine for background AI work: goals, command sessions, loops and "
        "worker identity, recorded as events on an append-only log.",
        epilog="Exit codes: 0 ok, 1 internal error, 2 bad usage or input, 3 conflict, 4 storage problem.",
    )
    parser.add_argument(
        "--store",
        default=None,
        help=f"the log: sqlite:PATH or ndjson:PATH (default: ${STORE_ENV} or {DEFAULT_STORE})",
    )
    parser.add_argument("--verbose", action="store_true", help="log progress and show tracebacks of errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module in _command_modules(log_cmds):
        module.register(sub)
    return parser


def _command_modules(*always: ModuleType) -> list[ModuleType]:
    modules: list[ModuleType] = list(always)
    import importlib

    for name in (
        "domain_cmds", "host_cmds", "saga_cmds", "projector_cmds", "query_cmds", "postmortem_cmds", "import_cmds",
        "cmd_cmds", "demo_cmds",
    ):
        try:
            modules.append(importlib.import_module(f"{__package__}.{name}"))
        except ModuleNotFoundError as e:
            if e.name != f"{__package__}.{name}":
                raise
    return modules


def store_url(args: argparse.Namespace) -> str:
    """The store URL the user asked for: ``--store``, then ``$LOOPD_ES_STORE``, then the default."""
    return args.store or os.environ.get(STORE_ENV) or DEFAULT_STORE


def main(*argv: str) -> int:
    """Run one command and return its exit code; tests call this in-process."""
    args_list = list(argv) if argv else sys.argv[1:]
    parser = build_parser()
    verbose = "--verbose" in args_list
    try:
        args = parser.parse_args(args_list)
    except _UsageExit as e:
        print(str(e), file=sys.stderr)
        return EXIT_USAGE
    if verbose:
        logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE

    async def run() -> int:
        return await handler(args)

    try:
        return anyio.run(run)
    except LoopdError as e:
        if verbose:
            logging.exception("failed")
        print(f"loopd-es: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except Exception as e:  # a bug: say so in one line, traceback only with --verbose
        if verbose:
            raise
        print(f"loopd-es: internal error: {type(e).__name__}: {e} (rerun with --verbose)", file=sys.stderr)
        return EXIT_INTERNAL


def entry() -> NoReturn:
    """Console-script entry point."""
    raise SystemExit(main())
