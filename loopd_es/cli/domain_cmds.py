"""``loopd-es events`` (the catalogue) and ``loopd-es replay`` (folded state of one stream or every aggregate)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import msgspec

from ..clock import stamped_builtins
from ..errors import UsageError
from ..text_safe import term_line
from .options import non_negative_number, parse_time, store_url


def register(subparsers: Any) -> None:
    """Add ``events`` and ``replay`` to the command tree."""
    events = subparsers.add_parser(
        "events",
        help="list the event catalogue (each type with its payload fields)",
        description="List every event type this version knows, with its schema version and payload fields.",
    )
    events.add_argument("--schema", action="store_true", help="print the payloads' JSON Schema instead")
    events.set_defaults(handler=_events)

    replay = subparsers.add_parser(
        "replay",
        help="fold the log into state: one stream, or a one-line summary per aggregate",
        description="Fold events into state. With --stream, print that stream's folded state (from its "
        "snapshot when one fits); without it, one line per aggregate of the whole log.",
    )
    replay.add_argument("--stream", help="the stream to fold, e.g. goal-<id> or command-<id>")
    cut = replay.add_mutually_exclusive_group()
    cut.add_argument(
        "--until", type=non_negative_number, metavar="POSITION", help="stop after this global position"
    )
    cut.add_argument(
        "--at",
        metavar="TIME",
        help="stop after events recorded at or before TIME (ISO 8601, UTC; "
        "a time written to the ms or the second covers all of it)",
    )
    replay.add_argument("--json", action="store_true", help="print the folded state as JSON")
    replay.add_argument(
        "--no-snapshots", action="store_true", help="fold from the first event, ignore snapshots"
    )
    replay.add_argument(
        "--check",
        action="store_true",
        help="re-decide every recorded goal (or --stream's) with this version's deciders; exit 3 naming the goal, "
        "event and field where a decision would differ",
    )
    replay.set_defaults(handler=_replay)


async def _events(args: argparse.Namespace) -> int:
    from ..events.catalogue import describe, json_schema

    if args.schema:
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(json_schema())).decode() + "\n")
        return 0
    for type_, version, summary, fields in describe():
        print(f"{type_} (v{version}): {summary}")
        for f in fields:
            default = "" if f.required else f" = {f.default}"
            print(f"    {f.name}: {f.type}{default}")
    return 0


async def _replay(args: argparse.Namespace) -> int:
    from ..domain.reducers import reducer_versions
    from ..log import open_store, parse_store_url
    from ..replay import SnapshotStore, replay_all, replay_stream

    if args.check:
        from .whatif_cmds import check

        if args.until is not None or args.at is not None:
            raise UsageError("replay --check replays whole goals: leave out --until and --at")
        return await check(args)
    if args.until is not None and args.until < 0:
        raise UsageError(f"--until must be a position >= 0, got {args.until}")
    at = parse_time(args.at)
    url = store_url(args)
    async with await open_store(url, create=False) as store:
        if args.stream is None:
            states = await replay_all(store, until=args.until, at=at)
            if args.json:
                body = {name: f.state for name, f in sorted(states.items())}
                sys.stdout.write(msgspec.json.encode(stamped_builtins(body)).decode() + "\n")
            for name in sorted(states) if not args.json else ():
                print(term_line(states[name].summary()))
            return 0
        snapshots = None
        if not args.no_snapshots:
            snapshots = SnapshotStore.beside(parse_store_url(url)[1], reducer_versions())
            snapshots.discard_stale()
        folded = await replay_stream(store, args.stream, until=args.until, at=at, snapshots=snapshots)
    if args.json:
        sys.stdout.write(
            msgspec.json.format(msgspec.json.encode(stamped_builtins(folded.state))).decode() + "\n"
        )
    else:
        origin = f"snapshot v{folded.snapshot_version} + " if folded.snapshot_version else ""
        print(
            term_line(
                f"{folded.summary()}  [{origin}{folded.folded} events folded, position {folded.position}]"
            )
        )
    return 0
