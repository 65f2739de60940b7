"""Option helpers every command group shares: the store URL, ``--host``, and time arguments.

Command modules never import each other; what two of them need lives here (and ``main`` re-exports
:func:`store_url` for the modules that still take it from there). Every import beyond ``errors`` is made
inside the helper that needs it: ``main`` imports this module on every start-up.
"""

from __future__ import annotations

import argparse
import os
from datetime import datetime
from typing import TYPE_CHECKING

from ..errors import UsageError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    import anyio

DEFAULT_STORE = "sqlite:.loopd/events.db"
STORE_ENV = "LOOPD_ES_STORE"


def store_url(args: argparse.Namespace) -> str:
    """The store URL the user asked for: ``--store``, then ``$LOOPD_ES_STORE``, then the default."""
    return getattr(args, "store", None) or os.environ.get(STORE_ENV) or DEFAULT_STORE


def add_host_option(parser: argparse.ArgumentParser) -> None:
    """``--host URL``, shared by every command that talks to a worker host."""
    from ..host import DEFAULT_HOST, HOST_ENV

    parser.add_argument(
        "--host",
        default=None,
        metavar="URL",
        help="the worker host: sim:FILE (a simulated host scripted in JSON or TOML) or "
        f"opencode:http://HOST:PORT (a running `opencode serve`) (default: ${HOST_ENV} or {DEFAULT_HOST})",
    )


def parse_time(text: str | None, option: str = "--at") -> datetime | None:
    """An RFC 3339 time given on the command line (``None`` stays ``None``).

    :raises UsageError: naming ``option`` and showing the expected form.
    """
    from ..clock import parse_rfc3339

    if text is None:
        return None
    try:
        return parse_rfc3339(text)
    except ValueError:
        raise UsageError(
            f"invalid {option} {text!r}: use an ISO 8601 time, e.g. 2026-12-02T12:00:00Z"
        ) from None


def add_project_argument(p: argparse.ArgumentParser) -> None:
    """The ``DIR`` of a loopd project (``import-loopd``, ``mirror-loopd``)."""
    p.add_argument("directory", metavar="DIR", help="the project directory (the one holding .opencode/loopd)")


async def cancel_on_signal(scope: anyio.CancelScope, signals: AsyncIterator[int] | None = None) -> None:
    """Cancel ``scope`` at the first SIGINT or SIGTERM: how a following command stops cleanly (exit 0).

    ``signals``: a receiver the caller opened earlier, so a signal during its start-up is not lost.
    """
    import signal

    import anyio

    if signals is not None:
        async for _ in signals:
            scope.cancel()
            return
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as received:
        async for _ in received:
            scope.cancel()
            return
