"""``loopd-es mirror-loopd DIR [--follow] [--json]``: keep the log up to date with a running opencode-loopd project.

Without ``--follow`` it is one pass: on a log that holds nothing of the project that pass is exactly
``import-loopd``; afterwards it appends only what is new. With ``--follow`` it passes again on every change
to ``state.json`` or ``events.ndjson`` until Ctrl-C or SIGTERM (exit 0). ``--json`` prints one JSON object
per pass that appended something (and for the first pass), with the time it landed, so a reader can
measure the lag from the ledger line's write.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

if TYPE_CHECKING:
    from ..errors import LoopdError
    from ..importer.mirror import MirrorPass


def register(subparsers: Any) -> None:
    """Add ``mirror-loopd`` to the command tree."""
    from ..importer.mirror import SETTLE
    from .options import add_project_argument

    p = subparsers.add_parser(
        "mirror-loopd",
        help="mirror a running opencode-loopd project into the log, fact by fact (--follow keeps watching)",
        description="Append what DIR/.opencode/loopd/state.json and events.ndjson (with its rotated segments "
        "events.ndjson.N) say that the log does not hold yet. The first pass on a log without the project is "
        "`import-loopd`; later passes continue each goal and command stream from its last mirrored ledger "
        "line, so a mirror stopped at any point (even kill -9) resumes without duplicates or gaps.",
    )
    add_project_argument(p)
    p.add_argument("--follow", action="store_true", help="keep watching and mirror each change as it happens")
    p.add_argument("--json", action="store_true", help="print one JSON object per pass")
    p.add_argument(
        "--settle",
        type=float,
        default=SETTLE,
        metavar="SECONDS",
        help=f"with --follow: how long state.json must be unchanged before the facts only it holds are "
        f"mirrored (default {SETTLE}; loopd writes it just before the ledger line that explains it)",
    )
    p.set_defaults(handler=_mirror)


async def _mirror(args: argparse.Namespace) -> int:
    from ..errors import UsageError
    from ..importer.mirror import MirrorCache, follow, mirror_pass
    from ..log import open_store
    from ..text_safe import term_line
    from .options import cancel_on_signal, store_url

    if args.settle < 0:
        raise UsageError(f"--settle must be 0 or more seconds, got {args.settle}")
    directory = Path(args.directory)
    url = store_url(args)
    async with await open_store(url) as store:
        if not args.follow:
            _show(await mirror_pass(store, directory), directory, args.json, first=True)
            return 0

        async def on_pass(done: MirrorPass) -> None:
            _show(done, directory, args.json, first=False)

        async def on_error(e: LoopdError) -> None:
            line = term_line(f"loopd-es: mirror-loopd: {e}; trying again at the next change")
            print(line, file=sys.stderr, flush=True)

        cache = MirrorCache()
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            # fail fast (one line, exit 2 or 3) before the task group, which would wrap the error in a group
            done = await mirror_pass(store, directory, settle=args.settle, cache=cache)
            _show(done, directory, args.json, first=True)  # always said: it is watching from here on
            async with anyio.create_task_group() as tg:
                tg.start_soon(cancel_on_signal, tg.cancel_scope, signals)
                await follow(store, directory, on_pass, on_error, settle=args.settle, cache=cache)
    return 0


def _show(done: MirrorPass, directory: Path, as_json: bool, *, first: bool) -> None:
    """One pass: a JSON object, or a line saying what was appended (quiet follow passes print nothing)."""
    if not first and not done.appended:
        return
    if as_json:
        doc = {"directory": str(directory), "landed_at": time.time(), **msgspec.to_builtins(done)}
        sys.stdout.write(msgspec.json.encode(doc).decode() + "\n")
        sys.stdout.flush()
        return
    if done.imported:
        what = f"imported {directory}: {done.appended} events on {len(done.streams)} stream(s)"
    elif done.appended:
        lines = _ranges(done.ledger_lines)
        what = f"mirrored {done.appended} event(s) to {', '.join(done.streams)}" + (
            f" (ledger lines {lines})" if lines else " (from state.json)"
        )
    else:
        what = f"{directory} is up to date in the log (stream {done.stream})"
    if done.settle_in is not None:
        what += "; state.json is still changing, its corrections wait for it to settle"
    print(what, flush=True)


def _ranges(numbers: tuple[int, ...]) -> str:
    """``1-3, 7`` for ``(1, 2, 3, 7)``."""
    out: list[str] = []
    start = prev = None
    for n in numbers:
        if prev is not None and n == prev + 1:
            prev = n
            continue
        if start is not None:
            out.append(f"{start}-{prev}" if start != prev else f"{start}")
        start = prev = n
    if start is not None:
        out.append(f"{start}-{prev}" if start != prev else f"{start}")
    return ", ".join(out)
