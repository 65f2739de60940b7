"""``loopd-es [--store URL] COMMAND ...``: parse, run the command's coroutine with anyio, map errors to exit codes.

Every command group lives in its own module and exposes ``register(subparsers)``; each parser sets
``handler`` (an ``async def (args) -> int``) with ``set_defaults``. Errors derived from
:class:`~loopd_es.errors.LoopdError` print as one line on stderr and exit with their family's code.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from ..errors import EXIT_INTERNAL, EXIT_USAGE, LoopdError
from .options import DEFAULT_STORE as DEFAULT_STORE
from .options import STORE_ENV as STORE_ENV
from .options import store_url as store_url
from .terminal import sized

TYPE_CHECKING = False  # typing's costs `--help` 5 ms: mypy knows the name, and only annotations need it
if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from typing import Any, NoReturn

    Handler = Callable[[argparse.Namespace], Awaitable[int]]


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so usage errors get our one-line format and exit code 2."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["formatter_class"] = sized(kwargs.get("formatter_class", argparse.HelpFormatter))
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", _SubParsers)
        self.register("action", None, _Once)
        self.register("action", "store", _Once)

    def error(self, message: str) -> NoReturn:
        raise _UsageExit(f"{self.prog}: {message} (see `{self.prog} --help`)")


class _UsageExit(Exception):
    pass


class _Once(argparse.Action):
    """The default action (store the value), except that an option given twice is refused: the last one
    would silently win over the first (``--data A --data B``), and what a caller sent would be lost."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: Any = None
    ) -> None:
        if option is not None:
            given: set[str] = namespace.__dict__.setdefault("_options_given", set())
            if self.dest in given:
                parser.error(f"{'/'.join(self.option_strings)} given twice; give it once")
            given.add(self.dest)
        setattr(namespace, self.dest, values)


class _SubParsers(argparse._SubParsersAction):  # type: ignore[type-arg]
    """Subcommands whose own ``--help`` says what they do: one given only its one-line help gets it as its
    description too, so no ``loopd-es X --help`` opens on a bare usage line."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        text = kwargs.get("help")
        if kwargs.get("description") is None and text:
            kwargs["description"] = f"{text[0].upper()}{text[1:]}."
        parser: argparse.ArgumentParser = super().add_parser(name, **kwargs)
        return parser


COMMAND_MODULES: dict[str, str] = {
    "append": "log_cmds", "read": "log_cmds", "streams": "log_cmds", "verify": "log_cmds",
    "export": "log_cmds", "import": "log_cmds",
    "events": "domain_cmds", "replay": "domain_cmds", "whatif": "whatif_cmds",
    "models": "host_cmds", "host": "host_cmds",
    "goal": "saga_cmds",
    "project": "projector_cmds", "projections": "projector_cmds",
    "goals": "query_cmds", "commands": "query_cmds", "identities": "query_cmds",
    "history": "postmortem_cmds", "explain": "postmortem_cmds",
    "import-loopd": "import_cmds",
    "mirror-loopd": "mirror_cmds",
    "cmd": "cmd_cmds",
    "demo": "demo_cmds",
    "run": "engine_cmds", "notifications": "engine_cmds", "owner": "engine_cmds", "worker": "engine_cmds",
    "sim": "engine_cmds", "engines": "engines_cmds",
    "loop": "loop_cmds", "loops": "loop_cmds",
    "opencode": "opencode_cmds",
    "dash": "dash_cmds",
    "fork": "fork_cmds", "compare": "fork_cmds",
    "bundle": "bundle_cmds",
}  # fmt: skip
"""Which module defines each command, so one command imports only its own module (start-up time matters
for a CLI that agents call many times); ``tests/unit/test_cli_main.py`` checks it against the modules."""


COMMAND_HELP: dict[str, str] = {
    "append": "append events to a stream",
    "read": "read events, as a table or as NDJSON envelopes",
    "streams": "list the streams with their versions",
    "verify": "check every invariant of the log",
    "export": "copy the whole log into a new, empty log (another backend too)",
    "import": "copy a whole log from URL into this (empty) log",
    "events": "list the event catalogue (each type with its payload fields)",
    "replay": "fold the log into state: one stream, or a one-line summary per aggregate",
    "whatif": "re-run goals' recorded decisions under a changed policy: what would differ, what it would save",
    "models": "list the host's models and agents (quota is always unknown)",
    "host": "hold the simulated host's calls (prompt, switch_model, ...) until released",
    "goal": "create goals, switch their worker identity, pause/resume, feed provider errors",
    "project": "bring the read models up to date with the log",
    "projections": "inspect and repair the read models",
    "goals": "list goals: status, phase, model, budgets",
    "commands": "list command sessions: status, end reason, exit code, watch",
    "identities": "a goal's identity switches: who asked, why, how they ended",
    "history": "a goal's whole timeline, with what each event changed",
    "explain": "why a goal is in its current status: the causal chain",
    "import-loopd": "import an opencode-loopd project (state.json + events.ndjson) into the log",
    "mirror-loopd": "mirror a running opencode-loopd project into the log, fact by fact (--follow keeps watching)",
    "cmd": "command sessions: long-running processes in a PTY",
    "demo": "play a short scripted story (switches, a 429 and fallback, a rollback, a budget stop)",
    "run": "run the engine: goals advance by themselves (one engine per log, others stand by; or --shared)",
    "notifications": "owner notifications and whether they were delivered",
    "engines": "the engines on this log: lease holder, shared members, what each is doing",
    "owner": "owner operations: nudge, send, force-complete, force-block, abort",
    "worker": "worker tools: get, progress, complete (runs the checks), block",
    "sim": "make the simulated host's worker act (answer, idle, busy, fail, tool call)",
    "loop": "scheduled /loop tasks: add, list, cancel, pause, resume, stop-all, tick, run, history",
    "loops": "every /loop task: next due, last fire, missed slots, owner",
    "opencode": "set up an OpenCode project for loopd-es (custom tools)",
    "dash": "the live dashboard: goals, commands, loops, notifications, events (press ? for keys)",
    "fork": "a new goal whose state is GOAL's at one event, with its own worker (and another model, budget...)",
    "compare": "two goals side by side (a fork and its source): identity, budget, usage, outcome",
    "bundle": "one shareable, redacted file with a goal's events, its timeline and the redaction report",
}
"""Each command's one-line help, so ``loopd-es --help`` lists the commands without importing every command
module (a third of its start-up). ``tests/unit/test_log_cli.py`` checks it against what the modules register;
while a command is missing here, the overview falls back to importing the modules."""


def _untranslated() -> None:
    """argparse looks each help and usage text up in gettext's ``messages`` catalogue as it builds a parser
    (a search of the locale directories every time: half of building one). CPython ships no such
    catalogue, and where none is installed the answer is the text itself, so the look-up is skipped."""
    global _UNTRANSLATED
    if _UNTRANSLATED is None:
        import gettext

        _UNTRANSLATED = gettext.find("messages") is None
        if _UNTRANSLATED:
            setattr(argparse, "_", str)  # noqa: B010  (argparse's own alias of gettext.gettext)


_UNTRANSLATED: bool | None = None


def build_parser(command: str | None = None, *, overview: bool = False) -> argparse.ArgumentParser:
    """The command tree: every command, or (given ``command``) only what that command needs.

    With ``overview`` (no known command on the line: ``--help``, a typo), the commands are listed from
    :data:`COMMAND_HELP` without importing their modules.
    """
    _untranslated()
    parser = _Parser(
        prog="loopd-es",
        description="An event-sourced engine for background AI work: goals, command sessions and worker "
        "identity, recorded as events on an append-only log.",
        epilog="Exit codes: 0 ok, 1 internal error, 2 bad usage or input, 3 conflict, 4 storage problem.",
    )
    parser.add_argument(
        "--store",
        default=None,
        metavar="URL",
        help="the log: sqlite:PATH, ndjson:PATH, postgresql://USER@HOST:PORT/DB?schema=NAME, memory:NAME or "
        "bundle:FILE (a goal bundle, read-only) "
        f"(default: ${STORE_ENV} or {DEFAULT_STORE})",
    )
    parser.add_argument("--verbose", action="store_true", help="log progress and show tracebacks of errors")
    parser.add_argument("--version", action="store_true", help="print loopd-es's version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    if overview and command not in COMMAND_MODULES and COMMAND_HELP.keys() == COMMAND_MODULES.keys():
        # the overview needs names and one-liners, not the modules, nor a parser per command (argparse
        # builds each with a dozen gettext look-ups: as long as the rest of the start-up)
        for name, text in COMMAND_HELP.items():
            sub.choices[name] = parser
            sub._choices_actions.append(sub._ChoicesPseudoAction(name, (), text))
        return parser
    if command in COMMAND_MODULES:
        names = [COMMAND_MODULES[command]]
    else:
        names = list(dict.fromkeys(COMMAND_MODULES.values()))
    for name in names:
        importlib.import_module(f"{__package__}.{name}").register(sub)
    return parser


def overview_help() -> tuple[str, bool]:
    """What ``loopd-es --help`` prints (argparse's help action prints this text), and whether it may be kept
    for the next time (:mod:`.help_cache`): not when a gettext catalogue translated it, nor when the command
    table is incomplete and the modules' own help was used."""
    text = build_parser(None, overview=True).format_help()
    return text, bool(_UNTRANSLATED) and COMMAND_HELP.keys() == COMMAND_MODULES.keys()


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
    """Run one command and return its exit code; tests call this in-process.

    Ctrl-C at any moment (building the parser, parsing, running) ends it with 130 and no traceback."""
    try:
        return _main(list(argv) if argv else sys.argv[1:])
    except KeyboardInterrupt:
        return 130


def _main(args_list: list[str]) -> int:
    command = _command_of(args_list)
    parser = build_parser(command, overview=command not in COMMAND_MODULES)
    verbose = "--verbose" in args_list
    try:
        args = parser.parse_args(args_list)
    except _UsageExit as e:
        _say(str(e))
        return EXIT_USAGE
    bad = _not_utf8(args)
    if bad is not None:
        print(
            f"loopd-es: {bad} is not valid UTF-8; pass text, or use a file for binary data", file=sys.stderr
        )
        return EXIT_USAGE
    import logging  # after parsing: --help and usage errors do without it

    # one notice per repair or warning: ours, not the logging module's last-resort handler as well
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="loopd-es: %(message)s")
    if not verbose:  # the pool's every failed reconnect: an outage is said once, by whoever waits it out
        logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    if args.version:
        from ..version import version

        print(f"loopd-es {version()}")
        return 0
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE

    async def run() -> int:
        return await handler(args)

    try:
        if getattr(
            args, "loopless", False
        ):  # a read-only query: without the loop when it can (cli/loopless.py)
            from .loopless import run_without_loop

            done = run_without_loop(handler, args)
            if done is not None:
                return done
        import anyio  # only a command that runs needs the event loop; --help and usage errors do not

        return anyio.run(run)
    except LoopdError as e:
        if verbose:
            logging.exception("failed")
        from .words import cli_words

        hint = f" ({e.hint})" if e.hint else ""
        _say(f"loopd-es: {cli_words(str(e))}{hint}")
        return e.exit_code
    except BrokenPipeError:
        return 0
    except Exception as e:  # a bug: say so in one line, traceback only with --verbose
        if verbose:
            raise
        _say(f"loopd-es: internal error: {type(e).__name__}: {e} (rerun with --verbose)")
        return EXIT_INTERNAL


def _say(line: str) -> None:
    """Print one error line on stderr: control characters and bytes that are not UTF-8 (kept by argv as
    surrogates) are escaped, so an odd argument quoted in the message cannot break it into several lines."""
    from ..text_safe import term_line

    print(term_line(line).encode("utf-8", "backslashreplace").decode("utf-8"), file=sys.stderr)


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
