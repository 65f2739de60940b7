"""Finding a goal and its streams: from the ``goal_links`` read model when there is one, else by one log scan.

The read model (``projections/goal_links.py``) is found by name in the projection registry, never imported
from here (``projections`` depends on ``loopd_es``, not the reverse). It is caught up before it is trusted: a
goal's newest events must not be missing from its history because the projector was not running.
"""

from __future__ import annotations

import logging
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING, Final

import msgspec

from ..domain.streams import GOAL_PREFIX, goal_stream
from ..events.notification import STREAM as NOTICES_STREAM
from ..ids import UnknownGoalError as UnknownGoalError
from ..ids import resolve_goal_id
from ..log.base import NeedsEventLoop

if TYPE_CHECKING:
    from ..events.envelope import Envelope
    from ..log.base import LogStore
    from ..projector.base import Projection

log = logging.getLogger("loopd_es.postmortem")

LINKS_NAME: Final = "goal_links"


class GoalStreams(msgspec.Struct, frozen=True):
    """A resolved goal and every stream of its timeline, in name order (the goal's own stream first)."""

    goal_id: str
    streams: tuple[str, ...]
    source: str  # "goal_links" (the read model) or "scan" (the whole log was read)


class _Ref(msgspec.Struct):
    goal_id: str | None = None


_REF: Final = msgspec.json.Decoder(_Ref)


async def find_goal(
    store: LogStore, text: str, *, read_db: Path | None = None, links: Projection | None = None
) -> GoalStreams:
    """Resolve ``text`` (an id or a unique prefix) and list the goal's streams.

    With ``links`` (the ``goal_links`` projection) and ``read_db``, the read model is caught up and queried;
    otherwise the whole log is scanned once.

    :raises UnknownGoalError: when no goal or several goals match ``text``.
    """
    if links is not None and read_db is not None:
        await _catch_up(store, links, read_db)
        with closing(_connect(read_db)) as conn:
            goal_id = resolve_goal_id(text, _goal_ids_sql(conn, text))
            rows = conn.execute("SELECT stream FROM goal_links WHERE goal_id = ?", (goal_id,)).fetchall()
        return GoalStreams(goal_id, _ordered(goal_id, [r[0] for r in rows]), LINKS_NAME)
    goal_id = await resolve_goal(store, text)
    return GoalStreams(goal_id, _ordered(goal_id, await _scan(store, goal_id)), "scan")


async def resolve_goal(store: LogStore, text: str) -> str:
    """The goal id ``text`` is, or the one goal id it starts.

    :raises UnknownGoalError: when no goal or several goals match ``text``.
    """
    ids = [s[len(GOAL_PREFIX) :] for s in await store.streams() if s.startswith(GOAL_PREFIX)]
    return resolve_goal_id(text, ids)


def _goal_ids_sql(conn: sqlite3.Connection, text: str) -> list[str]:
    """Goal ids (with a goal stream) equal to or starting with ``text``: a range scan of the stream index."""
    low = goal_stream(text)
    rows = conn.execute(
        "SELECT DISTINCT goal_id FROM goal_links WHERE stream >= ? AND stream < ? AND stream = 'goal-' || goal_id "
        "LIMIT 6",
        (low, low + "\U0010ffff"),
    ).fetchall()
    return [r[0] for r in rows]


def _ordered(goal_id: str, streams: list[str]) -> tuple[str, ...]:
    own = goal_stream(goal_id)
    return (own, *sorted(s for s in set(streams) if s != own))


def of_another_goal(envelope: Envelope, goal_id: str) -> bool:
    """Whether an event on ``notifications``, linked to ``goal_id``, names another goal: that stream holds every
    goal's notices, and each is the goal's it names (a command's or a saga's stream is all of its goals')."""
    data = bytes(envelope.data)
    if envelope.stream != NOTICES_STREAM or b'"goal_id"' not in data:
        return False
    try:
        named = _REF.decode(data).goal_id
    except msgspec.DecodeError:
        return False
    return bool(named) and named != goal_id


async def _scan(store: LogStore, goal_id: str) -> list[str]:
    """Every stream linked to ``goal_id`` by the rules of ``goal_links``, found by reading the whole log."""
    own = goal_stream(goal_id)
    found = {own}
    needle = goal_id.encode()
    async for batch in store.read_batches():
        for env in batch:
            if env.stream in found or env.stream.startswith(GOAL_PREFIX):
                continue
            data = bytes(env.data)
            if needle in data and b'"goal_id"' in data:
                try:
                    if _REF.decode(data).goal_id == goal_id:
                        found.add(env.stream)
                except msgspec.DecodeError:
                    continue
    return sorted(found)


def _connect(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=60.0)


async def _catch_up(store: LogStore, links: Projection, read_db: Path) -> None:
    """Bring ``goal_links`` up to the log's head; a no-op (two small queries) when it already is."""
    head = await store.head()
    position, log_id = _checkpoint(read_db, links)
    if position == head and log_id is not None and await _first_id(store) == log_id:
        return
    if store.loopless:  # a one-shot query run without the event loop: it runs again with one
        raise NeedsEventLoop(f"the {links.name} read model in {read_db} is behind the log")
    from ..projector import Projector  # imported only when work is due: it brings watchfiles in

    log.info("catching up the %s read model in %s", links.name, read_db)
    async with await Projector.open(store, [links], read_db) as projector:
        await projector.run_once()


def _checkpoint(read_db: Path, links: Projection) -> tuple[int | None, str | None]:
    """The read model's checkpoint (``None`` when absent or of another version) and the log id it follows."""
    if not read_db.exists():
        return None, None
    try:
        with closing(_connect(read_db)) as conn:
            row = conn.execute(
                "SELECT position FROM projector_checkpoints WHERE name = ? AND version = ?",
                (links.name, links.version),
            ).fetchone()
            meta = conn.execute("SELECT value FROM projector_meta WHERE key = 'log_id'").fetchone()
    except sqlite3.Error:
        return None, None
    return (None if row is None else int(row[0])), (None if meta is None else str(meta[0]))


async def _first_id(store: LogStore) -> str | None:
    async for batch in store.read_batches(limit=1):
        return batch[0].event_id
    return None
