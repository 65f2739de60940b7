"""``loopd-es bundle GOAL -o goal.bundle [--redact default|none|RULES.toml] [--keep-text] [--json]``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import msgspec

from ..text_safe import term_line
from .options import store_url


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``bundle`` to the ``loopd-es`` parser."""
    p = sub.add_parser(
        "bundle",
        help="one shareable, redacted file with a goal's events, its timeline and the redaction report",
        description="Write one file holding the goal's events and its linked streams' events (switches, "
        "commands, notifications), the HTML timeline and the redaction report. By default secrets (env-like "
        "NAME=value, bearer tokens, API keys, private keys, emails, home paths) are removed and prompt, "
        "transcript and output text is replaced by its length and hash; ids stay, so the story still reads. "
        "Open it with --store bundle:FILE (read-only) for history, explain, whatif and dash.",
    )
    p.add_argument("goal", metavar="GOAL", help="the goal id, or a prefix that matches exactly one goal")
    p.add_argument("-o", "--output", type=Path, required=True, metavar="FILE", help="the bundle to write")
    p.add_argument(
        "--redact",
        default="default",
        metavar="default|none|RULES.toml",
        help="what to remove (default: secrets, emails, home paths and text; none: nothing; a TOML file: "
        "the default plus its patterns and text fields)",
    )
    p.add_argument("--keep-text", action="store_true", help="keep prompt, transcript and output text")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--read-db", type=Path, default=None, metavar="PATH", help=argparse.SUPPRESS)
    p.add_argument("--registry", default="projections", metavar="MODULE", help=argparse.SUPPRESS)
    p.set_defaults(handler=_bundle)


async def _bundle(args: argparse.Namespace) -> int:
    from ..log import open_store
    from ..postmortem.bundle import make_bundle
    from ..postmortem.redact import redactor_for
    from .postmortem_cmds import find_goal_streams

    redactor = redactor_for(args.redact, keep_text=args.keep_text)
    url = store_url(args)
    async with await open_store(url, create=False) as store:
        goal = await find_goal_streams(store, args, url)
        summary = await make_bundle(store, goal, args.output, redactor)
    if args.json:
        sys.stdout.write(msgspec.json.encode(summary).decode() + "\n")
        return 0
    removed: dict[str, Any] = summary.redaction.get("secrets", {})
    what = ", ".join(f"{n} {k}" for k, n in removed.items()) or "no secrets found"
    lines = [
        f"wrote goal {summary.goal_id}: {summary.events} events on {len(summary.streams)} streams, "
        f"{summary.bytes} bytes, to {summary.path}",
        f"redaction {summary.redaction['mode']}: {what}; {summary.redaction['text_fields']} text fields "
        "replaced by length and hash",
        f"open it: loopd-es --store bundle:{summary.path} history {summary.goal_id[:8]}",
    ]
    sys.stdout.write("".join(term_line(line) + "\n" for line in lines))
    return 0
