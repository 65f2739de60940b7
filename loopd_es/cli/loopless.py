"""Run a read-only command without an event loop, when it can answer that way.

Importing asyncio and anyio is most of a one-shot query's start-up (``docs/performance.md``, CLI start-up). A
command that only reads (``set_defaults(loopless=True)``) first runs with :data:`~.options.LOOPLESS_FLAG` set:
:func:`~.options.open_reader` then gives it an SQLite snapshot whose calls never suspend, so its coroutine runs
to its end in one ``send``. When the answer needs the loop (another backend, a read model to catch up), the
command raises :class:`~loopd_es.log.base.NeedsEventLoop` before it prints anything, and ``main`` runs it again
the ordinary way.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from ..log.base import NeedsEventLoop
from .options import LOOPLESS_FLAG

Handler = Callable[[argparse.Namespace], Awaitable[int]]


def run_without_loop(handler: Handler, args: argparse.Namespace) -> int | None:
    """The command's exit code, or None when it needs the event loop (nothing was printed or written).

    :raises RuntimeError: when the command suspended after all: a command marked loopless awaited real I/O.
    """
    setattr(args, LOOPLESS_FLAG, True)
    try:
        coroutine = handler(args)
        if not isinstance(coroutine, Coroutine):
            raise TypeError(f"the handler of {args.command!r} is no coroutine function")
        return _drive(coroutine, args.command)
    except NeedsEventLoop:
        return None
    finally:
        setattr(args, LOOPLESS_FLAG, False)


def _drive(coroutine: Coroutine[Any, Any, int], command: str) -> int:
    try:
        suspended = coroutine.send(None)
    except StopIteration as done:
        return int(done.value)
    coroutine.close()
    raise RuntimeError(
        f"`{command}` suspended without an event loop (on {suspended!r}): it is marked loopless but awaited I/O"
    )
