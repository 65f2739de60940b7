"""How a query reaches the read models: catch them up (or not), say how far behind the log they are, then run
the query on one snapshot of the read database (on a worker thread when an event loop runs)."""

from __future__ import annotations

import argparse
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Final, TypeVar

from ..errors import StoreUnavailableError
from ..log.base import NeedsEventLoop
from ..projector import default_read_db, load_registry
from ..projector.readdb import settled_status
from .main import store_url
from .options import open_reader

if TYPE_CHECKING:
    from ..log.base import LogStore
    from ..projector.readdb import ProjectionStatus

T = TypeVar("T")

QUERY_PROJECTIONS: Final = ("goals", "runs", "identities", "provider_limits", "commands", "awaits")
"""The read models the queries read; their lowest checkpoint is what "behind" is measured from."""


async def read_models(args: argparse.Namespace, query: Callable[[sqlite3.Connection], T]) -> T:
    """Catch the read models up (unless ``--no-catch-up``), warn when behind, then run ``query`` on them.

    :raises LogNotFoundError: when there is no log.
    :raises ProjectionError: when the read database cannot be used.
    :raises NeedsEventLoop: (run without a loop) when the read models need a catch-up or setting up.
    """
    url = store_url(args)
    read_db = Path(args.read_db if args.read_db is not None else default_read_db(url))
    try:
        store = await open_reader(args)
    except StoreUnavailableError as e:
        found = settled_status(read_db, load_registry()) if args.no_catch_up else None
        if found is None:
            raise
        print(  # what the read models hold is the answer asked for; the log's head is what cannot be had
            f"loopd-es: the log cannot be reached ({e}); answering from the read models as they are, up to "
            f"position {min((r.position for r in found[1] if r.name in QUERY_PROJECTIONS), default=0)}",
            file=sys.stderr,
        )
        return _run_query(read_db, query)
    try:
        if store.loopless:
            head, rows = await _settled(store, read_db, catch_up=not args.no_catch_up)
        else:
            from ..projector import Projector

            async with await Projector.open(store, load_registry(), read_db) as projector:
                if not args.no_catch_up:
                    await projector.run_once()
                head, rows = await projector.status()
    finally:
        await store.aclose()
    used = [r for r in rows if r.name in QUERY_PROJECTIONS]
    behind = head - min((r.position for r in used), default=head)
    if behind > 0:
        print(
            f"loopd-es: read models are {behind} event{'s' if behind != 1 else ''} behind the log "
            "(run `loopd-es project`)",
            file=sys.stderr,
        )
    parked = sum(r.parked for r in used)
    if parked:
        print(
            f"loopd-es: {parked} event(s) are parked and missing from these answers; "
            "see `loopd-es projections status`",
            file=sys.stderr,
        )
    if store.loopless:
        return _run_query(read_db, query)
    import anyio.to_thread  # the event loop's thread stays free while SQLite reads

    return await anyio.to_thread.run_sync(_run_query, read_db, query)


async def _settled(store: LogStore, read_db: Path, *, catch_up: bool) -> tuple[int, list[ProjectionStatus]]:
    """Without an event loop: the log's head and the read models' status, when the projector would find
    nothing to do (nothing to set up; with ``catch_up``, the same log and every queried model at its head).

    :raises NeedsEventLoop: otherwise.
    """
    found = settled_status(read_db, load_registry())
    if found is None:
        raise NeedsEventLoop(f"the read database {read_db} needs setting up")
    log_id, rows = found
    head = await store.head()
    if catch_up:
        first = None
        async for batch in store.read_batches(limit=1):
            first = batch[0].event_id
        at = [r.position for r in rows if r.name in QUERY_PROJECTIONS]
        ahead = any(r.position > head for r in rows)  # the projector refuses that: let it say so
        if log_id != first or ahead or any(position != head for position in at):
            raise NeedsEventLoop(f"the read models in {read_db} are not at the log's head {head}")
    return head, rows


def _run_query(path: Path, query: Callable[[sqlite3.Connection], T]) -> T:
    conn = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)
    try:
        conn.row_factory = sqlite3.Row
        conn.execute("BEGIN")  # one snapshot for every table a query reads
        return query(conn)
    finally:
        conn.close()
