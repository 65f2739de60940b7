"""``loopd-es [--store URL] COMMAND ...``: parse, run the command's coroutine with anyio, map errors to exit codes.

Every command group lives in its own module and exposes ``register(subparsers)``; each parser sets
``handler`` (an ``async def (args) -> int``) with ``set_defaults``. Errors derived from
:class:`~loopd_es.errors.LoopdError` print as one line on stderr and exit with their family's code.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Awaitable, Callable
from typing import NoReturn

import anyio

from ..errors import EXIT_INTERNAL, EXIT_USAGE, LoopdError
from .options import DEFAULT_STORE, STORE_ENV
from .options import store_url as store_url

Handler = Callable[[argparse.Namespace], Awaitable[int]]


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so usage errors get our one-line format and exit code 2."""

    def error(self, message: str) -> NoReturn:
        raise _UsageExit(f"{self.prog}: {message} (see `{self.prog} --help`)")


class _UsageExit(Exception):
    pass


COMMAND_MODULES: dict[str, str] = {
    "append": "log_cmds", "read": "log_cmds", "streams": "log_cmds", "verify": "log_cmds",
    "export": "log_cmds", "import": "log_cmds",
    "events": "domain_cmds", "replay": "domain_cmds",
    "models": "host_cmds",
    "goal": "saga_cmds",
    "project": "projector_cmds", "projections": "projector_cmds",
    "goals": "query_cmds", "commands": "query_cmds", "identities": "query_cmds",
    "history": "postmortem_cmds", "explain": "postmortem_cmds",
    "import-loopd": "import_cmds",
    "cmd": "cmd_cmds",
    "demo": "demo_cmds",
    "run": "engine_cmds", "notifications": "engine_cmds", "owner": "engine_cmds", "worker": "engine_cmds",
    "sim": "engine_cmds",
    "opencode": "opencode_cmds",
    "dash": "dash_cmds",
}  # fmt: skip
"""Which module defines each command, so one command imports only its own module (start-up time matters
for a CLI that agents call many times); ``tests/unit/test_cli_main.py`` checks it against the modules."""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command tree: every command, or (given ``command``) only what that command needs."""
    parser = _Parser(
        prog="loopd-es",
        description="An event-sourced engine for background AI work: goals, command sessions and worker "
        "identity, recorded as events on an append-only log.",
        epilog="Exit codes: 0 ok, 1 internal error, 2 bad usage or input, 3 conflict, 4 storage problem.",
    )
    parser.add_argument(
        "--store",
        default=None,
        help=f"the log: sqlite:PATH or ndjson:PATH (default: ${STORE_ENV} or {DEFAULT_STORE})",
    )
    parser.add_argument("--verbose", action="store_true", help="log progress and show tracebacks of errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    if command in COMMAND_MODULES:
        names = [COMMAND_MODULES[command]]
    else:
        names = list(dict.fromkeys(COMMAND_MODULES.values()))
    for name in names:
        importlib.import_module(f"{__package__}.{name}").register(sub)
    return parser


def _command_of(args: list[str]) -> str | None:
    """The command word of a command line: the first argument that is not a global option or its value."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--store":
            i += 2
            continue
        if arg.startswith("-"):
            i += 1
            continue
        return arg
    return None


def main(*argv: str) -> int:
    """Run one command and return its exit code; tests call this in-process."""
    args_list = list(argv) if argv else sys.argv[1:]
    parser = build_parser(_command_of(args_list))
    verbose = "--verbose" in args_list
    try:
        args = parser.parse_args(args_list)
    except _UsageExit as e:
        print(str(e), file=sys.stderr)
        return EXIT_USAGE
    bad = _not_utf8(args)
    if bad is not None:
        print(f"loopd-es: {bad} is not valid UTF-8; pass text, or use a file for binary data", file=sys.stderr)
        return EXIT_USAGE
    # one notice per repair or warning: ours, not the logging module's last-resort handler as well
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="loopd-es: %(message)s")
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
        hint = f" ({e.hint})" if e.hint else ""
        print(f"loopd-es: {e}{hint}", file=sys.stderr)
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


def _not_utf8(args: argparse.Namespace) -> str | None:
    """The option whose value holds bytes that are not UTF-8 (argv keeps them as surrogates), if any."""
    for name, value in vars(args).items():
        for text in value if isinstance(value, list) else [value]:
            if isinstance(text, str):
                try:
                    text.encode()
                except UnicodeEncodeError:
                    return f"--{name.replace('_', '-')}"
    return None


def entry() -> NoReturn:
    """Console-script entry point."""
    raise SystemExit(main())
