"""``loopd-es dash``: the live terminal dashboard over the log and its read models."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import EXIT_INTERNAL, EXIT_OK, LogNotFoundError, UsageError
from .main import store_url

if TYPE_CHECKING:
    from ..dash.app import Dashboard


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``dash`` to the ``loopd-es`` parser."""
    p = sub.add_parser(
        "dash",
        help="the live dashboard: goals, commands, loops, notifications, events (press ? for keys)",
        description="A terminal dashboard that follows the log: goals with their budgets, identity, runs and "
        "history, command sessions with their output, loops, notifications and recent events, updating as events "
        "land from any process. Actions (pause, resume, nudge, switch, clear, terminate, attach ...) run the same "
        "commands as the CLI. Press ? for the keys.",
    )
    p.add_argument("--read-db", type=Path, default=None, metavar="PATH", help="the read database")
    p.set_defaults(handler=_dash)


async def _dash(args: argparse.Namespace) -> int:
    from ..log import open_store
    from ..projector import default_read_db

    url = store_url(args)
    try:  # a clear message before the screen takes over, not a traceback inside it
        store = await open_store(url, create=False)
    except LogNotFoundError as e:
        raise UsageError(f"{e}; create a goal or run `loopd-es demo` first, or pass --store") from e
    await store.aclose()
    from ..dash.app import Dashboard, main_config

    if args.read_db is None and store.read_only:  # a bundle: its read models live as long as the screen
        import tempfile

        with tempfile.TemporaryDirectory(prefix="loopd-es-bundle-") as scratch:
            return _ended(await _run(Dashboard(main_config(url, Path(scratch) / "read.db"))))
    read_db = args.read_db if args.read_db is not None else default_read_db(url)
    return _ended(await _run(Dashboard(main_config(url, Path(read_db)))))


async def _run(app: Dashboard) -> Dashboard:
    await app.run_async()
    return app


def _ended(app: Dashboard) -> int:
    """0 when the screen was closed; a crash inside it (Textual showed its traceback) is exit 1, a bug."""
    if app.return_code:
        sys.stderr.write("loopd-es: the dashboard stopped on an internal error (above); please report it\n")
        return EXIT_INTERNAL
    return EXIT_OK
