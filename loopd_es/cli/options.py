"""Option helpers every command group shares: the store URL, ``--host``, and time arguments.

Command modules never import each other; what two of them need lives here (and ``main`` re-exports
:func:`store_url` for the modules that still take it from there). Every import beyond ``errors`` is made
inside the helper that needs it: ``main`` imports this module on every start-up.
"""

from __future__ import annotations

import argparse
import os
import re

from ..errors import UsageError

TYPE_CHECKING = False  # not typing's: `--help` loads this module and does without typing (mypy knows it)
if TYPE_CHECKING:  # pathlib and datetime cost --help a seventh of its start-up: imported where used
    from collections.abc import AsyncIterator, Callable
    from datetime import datetime
    from typing import Final

    import anyio

    from ..log.base import LogStore

DEFAULT_STORE = "sqlite:.loopd/events.db"
STORE_ENV = "LOOPD_ES_STORE"


def store_url(args: argparse.Namespace) -> str:
    """The store URL the user asked for: ``--store``, then ``$LOOPD_ES_STORE``, then the default."""
    return getattr(args, "store", None) or os.environ.get(STORE_ENV) or DEFAULT_STORE


LOOPLESS_FLAG = "loopless_now"
"""The attribute :mod:`.loopless` sets on a command's arguments while it runs the command without a loop."""


async def open_reader(args: argparse.Namespace) -> LogStore:
    """The log a read-only command reads: a snapshot that never suspends while the command runs without an
    event loop (:mod:`.loopless`), else the store itself, opened without creating it.

    :raises NeedsEventLoop: (without a loop) when the snapshot cannot answer as the store would.
    :raises LogNotFoundError: when there is no log.
    """
    url = store_url(args)
    if getattr(args, LOOPLESS_FLAG, False):
        from pathlib import Path

        from ..log import POSTGRES_SCHEMES, parse_store_url
        from ..log.base import NeedsEventLoop
        from ..log.sqlite_snapshot import SqliteSnapshot

        if url.strip().startswith(POSTGRES_SCHEMES):
            raise NeedsEventLoop(f"{url} is not an SQLite log")
        scheme, path, options = parse_store_url(url)
        if scheme != "sqlite" or options:
            raise NeedsEventLoop(f"{url} is not a plain SQLite log")
        return SqliteSnapshot.open(Path(path))
    from ..log import open_store

    return await open_store(url, create=False)


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
    """A cut time given on the command line (``--at``; ``None`` stays ``None``): the end of the unit it is
    written to (:func:`~loopd_es.clock.parse_cut`), so a time copied from ``history`` takes its event.

    :raises UsageError: naming ``option`` and showing the expected form.
    """
    from ..clock import parse_cut

    if text is None:
        return None
    try:
        return parse_cut(text)
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


MAX_NUMBER: Final = (1 << 63) - 1
"""The largest position, version or count both backends can store."""
MAX_EPOCH_MS: Final = 253_402_300_799_999
"""The last millisecond of the year 9999, the last a date can hold."""


def positive_number(text: str) -> int:
    """An argparse type: a whole number from 1 up to :data:`MAX_NUMBER`."""
    return whole_number(text, 1, MAX_NUMBER)


def non_negative_number(text: str) -> int:
    """An argparse type: a whole number from 0 up to :data:`MAX_NUMBER`."""
    return whole_number(text, 0, MAX_NUMBER)


def epoch_ms(text: str) -> int:
    """An argparse type: a time as epoch milliseconds, from 1970 to the end of the year 9999."""
    return whole_number(text, 0, MAX_EPOCH_MS)


def whole_number(text: str, low: int, high: int) -> int:
    """A decimal integer from ``low`` to ``high``; anything else is a one-line usage error (exit 2)."""
    digits = text.strip()
    if not (digits.isascii() and digits.lstrip("-").isdigit()):
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}")
    value = int(digits)
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"must be between {low} and {high}, got {text!r}")
    return value


def non_negative_amount(text: str) -> float:
    """An argparse type: a finite number >= 0 (a cost in dollars, say); ``nan``, ``inf`` and ``-1`` are refused."""
    return _amount(text, 0.0 <= _finite(text), ">= 0")


MAX_DURATION_MS: Final = 365 * 86_400_000
"""A year: longer durations only overflow the times they are added to."""


def ms_at_least(low: int) -> Callable[[str], int]:
    """An argparse type: a duration in milliseconds from ``low`` up to :data:`MAX_DURATION_MS`."""

    def number(text: str) -> int:
        return whole_number(text, low, MAX_DURATION_MS)

    return number


def positive_amount(text: str) -> float:
    """An argparse type: a finite number > 0 (a duration in seconds, say)."""
    return _amount(text, _finite(text) > 0.0, "> 0")


def _finite(text: str) -> float:
    """``text`` as a number, ``nan`` for one that is not finite (every comparison with it is false)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    return value if value not in (float("inf"), float("-inf")) else float("nan")


def _amount(text: str, fits: bool, bound: str) -> float:
    if not fits:
        raise argparse.ArgumentTypeError(f"must be a finite number {bound}, got {text!r}")
    return float(text)


_DECIMAL = re.compile(
    r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|[+-]?(?:inf|infinity|nan)", re.IGNORECASE | re.ASCII
)
_WHOLE = re.compile(r"[+-]?\d+", re.ASCII)


def decimal_number(text: str) -> float:
    """An argparse type: a decimal number as JSON or JavaScript writes it (``1_0``, ``0x10`` and ``١`` are not), bounds later."""
    if not _DECIMAL.fullmatch(text.strip()):
        raise argparse.ArgumentTypeError(f"not a number: {text!r}")
    return float(text)


def decimal_integer(text: str) -> int:
    """An argparse type: a whole decimal number (``1_0`` and ``٣`` are not), bounds later."""
    if not _WHOLE.fullmatch(text.strip()):
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}")
    return int(text)
