"""Post-mortem commands: ``history GOAL [--json] [--until POSITION | --at TIME] [--html FILE]`` and
``explain GOAL [--json]``.

Both are read-only. They find the goal's streams through the ``goal_links`` read model when the projection
registry has it (catching it up first), else by one scan of the log; everything heavy is imported inside the
handlers so that the rest of the CLI does not pay for it at start-up.
"""

from __future__ import annotations

import argparse
import functools
import gc
import logging
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from ..text_safe import term_line
from .options import non_negative_number, open_reader, parse_time, store_url
from .terminal import parent_parser

if TYPE_CHECKING:
    from ..log.base import LogStore
    from ..postmortem.links import GoalStreams
    from ..projector.base import Projection

log = logging.getLogger("loopd_es.postmortem")


def _gc_paused(
    handler: Callable[[argparse.Namespace], Awaitable[int]],
) -> Callable[[argparse.Namespace], Awaitable[int]]:
    """Run ``handler`` with the cyclic garbage collector paused.

    A timeline is tens of thousands of small objects that refcounting alone frees (no cycles); with the
    collector on, a 10k-event history spends ~20 ms in collections that find nothing.
    """

    @functools.wraps(handler)
    async def run(args: argparse.Namespace) -> int:
        enabled = gc.isenabled()
        gc.disable()
        try:
            return await handler(args)
        finally:
            if enabled:
                gc.enable()

    return run


def register(subparsers: Any) -> None:
    """Add ``history`` and ``explain`` to the command tree."""
    common = parent_parser()
    common.add_argument("goal", metavar="GOAL", help="the goal id, or a prefix that matches exactly one goal")
    common.add_argument("--json", action="store_true", help="print one JSON document")
    common.add_argument(
        "--read-db",
        type=Path,
        default=None,
        metavar="PATH",
        help="the read database holding goal_links (default: read.db beside the log)",
    )
    common.add_argument(
        "--registry",
        default="projections",
        metavar="MODULE",
        help="the module whose ALL list holds the projections (default: projections)",
    )

    p = subparsers.add_parser(
        "history",
        parents=[common],
        help="a goal's whole timeline, with what each event changed",
        description="Print the goal's timeline: its own stream plus its switch sagas and linked commands, in "
        "global order (an imported goal: in the order of its source's times); for each event of the goal's "
        "stream, the fields of the folded goal state it changed, for other events a summary of the payload. --until/--at cut the timeline; --html writes it as a "
        "self-contained page (status, identity and run lanes on a time axis).",
    )
    cut = p.add_mutually_exclusive_group()
    cut.add_argument(
        "--until", type=non_negative_number, metavar="POSITION", help="stop after this global position"
    )
    cut.add_argument(
        "--at",
        metavar="TIME",
        help="only the events that had happened by TIME (ISO 8601, UTC; a time written to the ms, as history "
        "prints it, covers that whole ms; an imported event's time is its source's, not the import's)",
    )
    p.add_argument("--html", type=Path, metavar="FILE", help="write the timeline as one HTML file instead")
    p.set_defaults(handler=_history, loopless=True)

    p = subparsers.add_parser(
        "explain",
        parents=[common],
        help="why a goal is in its current status: the causal chain",
        description="Walk from the event that set the goal's status back to its first cause along causation "
        "ids (and from an applied pending switch to the event that set it up), naming the events of the same "
        "reaction and flow; where a link is missing, say so.",
    )
    p.set_defaults(handler=_explain, loopless=True)


async def find_goal_streams(store: LogStore, args: argparse.Namespace, url: str) -> GoalStreams:
    from ..postmortem.links import find_goal
    from ..projector import default_read_db

    if store.read_only:  # a bundle: small, and no read model is written beside it
        return await find_goal(store, args.goal)
    links = _links_projection(args.registry)
    read_db = args.read_db or default_read_db(url)
    if links is None:
        log.warning(
            "note: the goal_links read model is not in %s.ALL: reading the whole log to find the goal's streams",
            args.registry,
        )
    return await find_goal(store, args.goal, read_db=read_db if links is not None else None, links=links)


def _links_projection(registry: str) -> Projection | None:
    """The registry's ``goal_links``: from its ``projection_named(name)`` when it has one (which imports no
    other read model), else found by name in its ``ALL`` list."""
    import importlib

    from ..postmortem.links import LINKS_NAME
    from ..projector import Projection, load_registry

    try:
        module = importlib.import_module(registry)
    except ModuleNotFoundError:
        return None
    named = getattr(module, "projection_named", None)
    if callable(named):
        found = named(LINKS_NAME)
        if found is None or isinstance(found, Projection):
            return found
    try:
        projections = load_registry(registry)
    except UsageError:
        return None
    return next((p for p in projections if p.name == LINKS_NAME), None)


@_gc_paused
async def _history(args: argparse.Namespace) -> int:
    import msgspec

    from ..postmortem.history import build_history, render_text, to_json

    if args.until is not None and args.until < 0:
        raise UsageError(f"--until must be a position >= 0, got {args.until}")
    at = parse_time(args.at)
    url = store_url(args)
    async with await open_reader(args) as store:
        goal = await find_goal_streams(store, args, url)
        history = await build_history(store, goal, until=args.until, at=at, provenance=args.html is not None)
        if args.html is not None:
            from ..postmortem.explain import explain

            explanation = await explain(store, history)
    if args.html is not None:
        from ..postmortem.timeline_html import render_html

        try:
            args.html.write_text(render_html(history, explanation), encoding="utf-8")
        except OSError as e:
            raise UsageError(f"cannot write the HTML timeline to {args.html}: {e.strerror}") from None
        if args.json:  # one JSON document, as every query with --json prints
            written = {"goal_id": goal.goal_id, "events": len(history.entries), "html": str(args.html)}
            sys.stdout.write(msgspec.json.encode(written).decode() + "\n")
        else:
            print(f"wrote the timeline of goal {goal.goal_id} ({len(history.entries)} events) to {args.html}")
        return 0
    out = sys.stdout
    if args.json:
        out.write(msgspec.json.encode(to_json(history)).decode() + "\n")
    else:
        out.write("\n".join(term_line(line) for line in render_text(history)) + "\n")
    return 0


@_gc_paused
async def _explain(args: argparse.Namespace) -> int:
    import msgspec

    from ..postmortem.explain import explain, render_text, to_json
    from ..postmortem.history import build_history

    url = store_url(args)
    async with await open_reader(args) as store:
        goal = await find_goal_streams(store, args, url)
        history = await build_history(store, goal, provenance=True)
        result = await explain(store, history)
    if args.json:
        sys.stdout.write(msgspec.json.encode(to_json(result)).decode() + "\n")
    else:
        sys.stdout.write("\n".join(term_line(line) for line in render_text(result)) + "\n")
    return 0
