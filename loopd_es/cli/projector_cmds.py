"""Projector commands: ``project [--follow]`` and ``projections status | retry | rebuild``."""

from __future__ import annotations

import argparse
import sqlite3
import sys
from pathlib import Path

import anyio
import msgspec

from ..errors import EXIT_CONFLICT, EXIT_OK
from ..log import open_store
from ..projector import DEFAULT_REGISTRY, ProjectionError, Projector, default_read_db, load_registry
from ..projector.progress import ProgressBar
from ..text_safe import term_line
from .main import store_url
from .options import cancel_on_signal
from .terminal import parent_parser


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the projector commands to the ``loopd-es`` parser."""
    common = parent_parser()
    common.add_argument(
        "--read-db",
        type=Path,
        default=None,
        metavar="PATH",
        help="the read database (default: read.db beside the log, e.g. .loopd/read.db)",
    )
    common.add_argument(
        "--registry",
        default=DEFAULT_REGISTRY,
        metavar="MODULE",
        help=f"the module whose ALL list holds the projections (default: {DEFAULT_REGISTRY})",
    )

    p = sub.add_parser(
        "project",
        parents=[common],
        help="bring the read models up to date with the log",
        description="Apply every event the read models have not seen yet, then exit; with --follow, keep "
        "applying new events as they are appended (woken by file events, with a slow poll as a safety net) "
        "until interrupted. Events a read model cannot apply are parked; see `projections status`.",
    )
    p.add_argument("--follow", action="store_true", help="keep following the log until Ctrl-C or SIGTERM")
    p.add_argument(
        "--poll",
        type=_seconds,
        default=1.0,
        metavar="SECONDS",
        help="with --follow: look at the log at least this often even without file events (default 1)",
    )
    p.set_defaults(handler=_project)

    p = sub.add_parser(
        "projections",
        help="inspect and repair the read models",
        description="status: each read model's position, lag behind the log head and parked events. "
        "retry: re-apply parked events (exit 3 when some stay parked). "
        "rebuild: drop read models and rebuild them from the whole log.",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True, parser_class=type(p))
    q = actions.add_parser("status", parents=[common], help="position, lag and parked events per read model")
    q.add_argument("--json", action="store_true", help="print one JSON document")
    q.set_defaults(handler=_status)
    q = actions.add_parser("retry", parents=[common], help="re-apply parked events")
    q.add_argument("name", nargs="?", help="only this read model")
    q.set_defaults(handler=_retry)
    q = actions.add_parser("rebuild", parents=[common], help="drop and rebuild read models from the log")
    q.add_argument("name", nargs="?", help="only this read model (default: all)")
    q.set_defaults(handler=_rebuild)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


async def _open(args: argparse.Namespace, *, replace_damaged: bool = False) -> Projector:
    """The projector of the log and its read database; ``replace_damaged`` (``projections rebuild``) starts a
    read database SQLite cannot read (malformed, not a database) afresh: it is disposable, and the rebuild was
    what its own error message recommended."""
    url = store_url(args)
    projections = load_registry(args.registry)
    store = await open_store(url, create=False)
    try:
        read_db = args.read_db if args.read_db is not None else default_read_db(url)
        try:
            return await Projector.open(store, projections, read_db)
        except ProjectionError as e:
            cause = e.__cause__
            damaged = isinstance(cause, sqlite3.DatabaseError) and not isinstance(
                cause, sqlite3.OperationalError
            )
            if not (replace_damaged and damaged):
                raise
            for path in (read_db, Path(f"{read_db}-wal"), Path(f"{read_db}-shm")):
                path.unlink(missing_ok=True)
            print(f"loopd-es: {read_db} was damaged ({cause}); starting it afresh", file=sys.stderr)
            return await Projector.open(store, projections, read_db)
    except BaseException:
        await store.aclose()
        raise


async def _close(projector: Projector) -> None:
    try:
        await projector.aclose()
    finally:
        await projector.store.aclose()


async def _project(args: argparse.Namespace) -> int:
    projector = await _open(args)
    bar = ProgressBar.for_terminal()
    try:
        if args.follow:
            await _follow(projector, args.poll, bar)
            return EXIT_OK
        applied = await projector.run_once(bar)
        if bar is not None:
            bar.close()
        head, rows = await projector.status()
        low = min((r.position for r in rows), default=head)
        print(f"applied {applied} event(s); read models at position {low} of {head} in {projector.read_db}")
        _warn_parked(sum(r.parked for r in rows))
        return EXIT_OK
    finally:
        await _close(projector)


async def _follow(projector: Projector, poll: float, bar: ProgressBar | None) -> None:
    """Follow until SIGINT/SIGTERM: cancelling the scope stops between transactions, never inside one."""

    def caught_up(position: int, head: int) -> None:
        if bar is not None:
            bar(position, head)
            if position >= head:
                bar.close()  # history done: live events need no bar

    async with anyio.create_task_group() as tg:
        tg.start_soon(cancel_on_signal, tg.cancel_scope)
        print(f"following {projector.store.url} into {projector.read_db} (Ctrl-C to stop)", file=sys.stderr)
        await projector.follow(poll_interval=poll, progress=caught_up)
    if bar is not None:
        bar.close()


def _warn_parked(parked: int) -> None:
    if parked:
        print(
            f"loopd-es: {parked} event(s) are parked (a read model could not apply them); "
            "see `loopd-es projections status`, then `loopd-es projections retry`",
            file=sys.stderr,
        )


async def _status(args: argparse.Namespace) -> int:
    projector = await _open(args)
    try:
        head, rows = await projector.status()
    finally:
        await _close(projector)
    if args.json:
        doc = {
            "log": projector.store.url,
            "read_db": str(projector.read_db),
            "head": head,
            "projections": [
                {
                    "name": r.name,
                    "version": r.version,
                    "position": r.position,
                    "lag": max(head - r.position, 0),
                    "parked": r.parked,
                    "last_error": r.last_error,
                }
                for r in rows
            ],
        }
        sys.stdout.buffer.write(msgspec.json.encode(doc) + b"\n")
        sys.stdout.flush()
        return EXIT_OK
    width = max([len("projection"), *(len(r.name) for r in rows)])
    print(f"{'projection':<{width}}  {'version':>7}  {'position':>10}  {'lag':>10}  {'parked':>6}")
    for r in rows:
        print(
            f"{r.name:<{width}}  {r.version:>7}  {r.position:>10}  {max(head - r.position, 0):>10}  {r.parked:>6}"
        )
        if r.last_error:
            print(f"{'':<{width}}  last parked: {term_line(str(r.last_error))}")
    print(f"log head {head} ({projector.store.url}); read db {projector.read_db}")
    return EXIT_OK


async def _retry(args: argparse.Namespace) -> int:
    projector = await _open(args)
    try:
        done, failed = await projector.retry(args.name)
    finally:
        await _close(projector)
    print(f"re-applied {done} parked event(s); {failed} still parked")
    if failed:
        print(
            "loopd-es: some events are still parked; `loopd-es projections status` shows why", file=sys.stderr
        )
        return EXIT_CONFLICT
    return EXIT_OK


async def _rebuild(args: argparse.Namespace) -> int:
    projector = await _open(args, replace_damaged=True)
    bar = ProgressBar.for_terminal()
    try:
        names = projector.names(args.name)
        await projector.rebuild(args.name, bar)
        if bar is not None:
            bar.close()
        head, rows = await projector.status()
    finally:
        await _close(projector)
    print(f"rebuilt {', '.join(names)} from {head} event(s) in {projector.read_db}")
    _warn_parked(sum(r.parked for r in rows if r.name in names))
    return EXIT_OK
