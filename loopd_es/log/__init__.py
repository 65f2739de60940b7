"""The append-only log: one contract (:class:`LogStore`), several backends, opened by URL.

``sqlite:PATH`` (the default, ``sqlite:.loopd/events.db``), ``ndjson:PATH`` and
``postgresql://USER@HOST:PORT/DB?schema=NAME`` (a server shared by many machines); a bare path ending in
``.ndjson``/``.jsonl`` means NDJSON and any other bare path means SQLite. ``memory:NAME`` is the in-memory
reference backend (:mod:`.memory`), shared by name within one process, for tests. NDJSON takes a durability mode as a
query: ``ndjson:events.ndjson?durability=batch`` (``always`` by default, ``batch``, ``none``);
SQLite takes ``?synchronous=FULL|NORMAL|OFF``. ``bundle:FILE`` opens a goal bundle (``loopd-es bundle``)
read-only (:mod:`.bundle`).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qsl

from ..errors import UsageError
from .base import LogStore as LogStore  # noqa: TC001 - a runtime re-export


async def open_store(url: str, *, create: bool = True) -> LogStore:
    """Open (and, with ``create``, create) the log at ``url``.

    :raises UsageError: for an unknown scheme or option.
    :raises LogNotFoundError: when the log does not exist and ``create`` is false.
    :raises StoreUnavailableError: when the path cannot be opened.
    """
    if url.strip().startswith(POSTGRES_SCHEMES):
        try:
            from .postgres import PostgresLog
        except ImportError as e:
            raise UsageError(
                f"{url.split('@')[-1]!r} needs the PostgreSQL driver: pip install 'loopd-es[postgres]' ({e})"
            ) from e

        return await PostgresLog.open(url, create=create)
    scheme, path, options = parse_store_url(url)
    if scheme == "bundle":
        from .bundle import BundleLog

        _no_more(url, options)
        return await BundleLog.open_bundle(Path(path))
    if scheme == "memory":
        from .memory import MemoryLog

        _no_more(url, options)
        return await MemoryLog.open(path, create=create)
    if scheme == "ndjson":
        from .ndjson import NdjsonLog

        durability = options.pop("durability", "always")
        _no_more(url, options)
        return await NdjsonLog.open(Path(path), durability=durability, create=create)
    from .sqlite import SqliteLog

    synchronous = options.pop("synchronous", "FULL")
    _no_more(url, options)
    return await SqliteLog.open(Path(path), synchronous=synchronous, create=create)


POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def parse_store_url(url: str) -> tuple[str, str, dict[str, str]]:
    """Split ``scheme:PATH?k=v`` into its parts.

    :raises UsageError: for an empty path or an unknown scheme.
    """
    text = url.strip()
    if "\x00" in text:
        raise UsageError(f"store URL {url!r} holds a NUL byte; no path can")
    query = ""
    if "?" in text:
        text, query = text.split("?", 1)
    if ":" in text and text.split(":", 1)[0] in ("sqlite", "ndjson", "memory", "bundle"):
        scheme, path = text.split(":", 1)
    elif ":" in text and len(text.split(":", 1)[0]) > 1 and "/" not in text.split(":", 1)[0]:
        raise UsageError(
            f"unknown store scheme in {url!r}: use sqlite:PATH, ndjson:PATH or postgresql://USER@HOST:PORT/DB"
        )
    else:
        path = text
        scheme = "ndjson" if path.endswith((".ndjson", ".jsonl")) else "sqlite"
    path = path.removeprefix("//")
    if not path:
        raise UsageError(f"store URL {url!r} has no path: use e.g. sqlite:.loopd/events.db")
    return scheme, path, dict(parse_qsl(query))


def _no_more(url: str, options: dict[str, str]) -> None:
    if options:
        raise UsageError(f"unknown store option(s) {sorted(options)} in {url!r}")
