"""What the dashboard shows, read from the read models, the log and the command output files.

Everything here is a snapshot taken in one read transaction (or one log read), so a screen never mixes two
moments. The read models are kept current by the projector the dashboard runs (:mod:`.live`); these functions
only read. Text that came from a goal's worker or a command's output is made safe for a terminal by the caller.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..log.base import LogStore

Row = dict[str, Any]


@dataclass(frozen=True)
class Snapshot:
    """The lists on the dashboard's tabs, as of one read."""

    goals: list[Row] = field(default_factory=list)
    commands: list[Row] = field(default_factory=list)
    loops: list[Row] = field(default_factory=list)
    notifications: list[Row] = field(default_factory=list)


def _rows(conn: sqlite3.Connection, sql: str, params: tuple[Any, ...] = ()) -> list[Row]:
    try:
        return [dict(row) for row in conn.execute(sql, params)]
    except sqlite3.OperationalError as e:  # a read model this installation does not have (yet)
        if "no such table" in str(e):
            return []
        raise


def _connect(read_db: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(f"{read_db.absolute().as_uri()}?mode=ro", uri=True, timeout=5)
    conn.row_factory = sqlite3.Row
    return conn


def snapshot(read_db: Path) -> Snapshot:
    """Goals and commands (newest first, a stable order), loops and notifications, in one read transaction."""
    if not read_db.exists():
        return Snapshot()
    conn = _connect(read_db)
    try:
        conn.execute("BEGIN")
        return Snapshot(
            goals=_rows(conn, "SELECT * FROM goals WHERE cleared = 0 ORDER BY created_at DESC, goal_id"),
            commands=_rows(
                conn, "SELECT * FROM commands WHERE removed = 0 ORDER BY started_at DESC, command_id"
            ),
            loops=_rows(conn, "SELECT * FROM loops ORDER BY task_id"),
            notifications=_rows(conn, "SELECT * FROM notifications ORDER BY position DESC LIMIT 50"),
        )
    finally:
        conn.close()


def goal_detail(read_db: Path, goal_id: str) -> Row:
    """One goal's row with its runs and identity switches."""
    conn = _connect(read_db)
    try:
        conn.execute("BEGIN")
        goal = _rows(conn, "SELECT * FROM goals WHERE goal_id = ?", (goal_id,))
        if not goal:
            return {}
        return {
            **goal[0],
            "runs": _rows(conn, "SELECT * FROM runs WHERE goal_id = ? ORDER BY started_position", (goal_id,)),
            "switches": _rows(
                conn,
                "SELECT * FROM identity_switches WHERE goal_id = ? ORDER BY requested_at, switch_id",
                (goal_id,),
            ),
        }
    finally:
        conn.close()


def output_tail(store_url: str, command_id: str, lines: int = 200) -> list[str]:
    """The last ``lines`` lines of a command's output file (``commands/<id>.log`` beside the log)."""
    from ..procs.paths import CommandPaths

    try:
        path = CommandPaths(store_url).log(command_id)
    except Exception:  # an id that is not a valid command id: nothing to show
        return []
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read()
    except OSError:
        return []
    return data.decode("utf-8", "replace").splitlines()[-lines:]


async def recent_events(store: LogStore, count: int = 100) -> list[Row]:
    """The newest ``count`` events of the whole log, newest first."""
    out: list[Row] = []
    async for batch in store.read_backwards(limit=count):
        out.extend(
            {"position": e.position, "recorded_at": e.recorded_at, "stream": e.stream, "type": e.type}
            for e in batch
        )
    return out[:count]


async def history_lines(store: LogStore, read_db: Path, goal_id: str, until: int | None = None) -> list[str]:
    """``loopd-es history`` of the goal, as of ``until`` (a global position), one line per text line."""
    from ..postmortem.history import build_history, render_text
    from ..postmortem.links import find_goal

    goal = await find_goal(store, goal_id, read_db=read_db, links=_links())
    return render_text(await build_history(store, goal, until=until))


async def history_positions(store: LogStore, read_db: Path, goal_id: str) -> list[int]:
    """The global positions of the goal's timeline, oldest first: the stops of the time cursor."""
    from ..postmortem.history import build_history
    from ..postmortem.links import find_goal

    goal = await find_goal(store, goal_id, read_db=read_db, links=_links())
    return [entry.envelope.position for entry in (await build_history(store, goal)).entries]


async def explain_lines(store: LogStore, read_db: Path, goal_id: str) -> list[str]:
    """``loopd-es explain`` of the goal."""
    from ..postmortem.explain import explain, render_text
    from ..postmortem.history import build_history
    from ..postmortem.links import find_goal

    goal = await find_goal(store, goal_id, read_db=read_db, links=_links())
    return render_text(await explain(store, await build_history(store, goal, provenance=True)))


def _links() -> Any:
    from projections import projection_named

    return projection_named("goal_links")
