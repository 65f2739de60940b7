"""``runs``: one row per worker run (turn) of every goal, from its start to how it ended.

The projection folds the goal stream with the domain's fold (state kept in ``runs_fold``) and looks at each
event's effect: an event the fold refuses (a stale run, an event after ``goal.cleared``) changes no row, and
a run ends exactly when the folded state stops naming it as the active run, whichever event did that
(``run.completed``, ``run.failed``, a pause, a block, a newer run...). So ``goals.phase = 'running'`` and a
``running`` row here always agree.

Statuses: ``running``, ``completed``, ``failed``, ``recovered`` (maintenance released a quiet run),
``superseded`` (a newer run started), ``budget_stopped`` (a budget stop aborted it), ``interrupted`` (another
goal event released it; ``end_event`` says which).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from loopd_es.clock import stamp_or_none
from loopd_es.events import goal as g
from loopd_es.events import run as r

from ._fold import GoalFolds, goal_groups, payload, when

if TYPE_CHECKING:
    from loopd_es.events.envelope import Envelope

_DDL: Final = """CREATE TABLE IF NOT EXISTS runs (
    goal_id TEXT NOT NULL, run_id TEXT NOT NULL, generation INTEGER NOT NULL, turn INTEGER NOT NULL,
    kind TEXT NOT NULL, charged INTEGER NOT NULL, prompt_message_id TEXT NOT NULL,
    status TEXT NOT NULL, end_event TEXT, error TEXT, failure_source TEXT, consecutive_failures INTEGER,
    retry_after TEXT, tokens INTEGER NOT NULL, cost REAL NOT NULL, idle_candidate_at TEXT,
    stuck_seconds REAL, watchdog TEXT, confirm_failed TEXT,
    started_at TEXT NOT NULL, ended_at TEXT, started_position INTEGER NOT NULL, ended_position INTEGER
)"""
# A rowid table (rows appended in log order) with a narrow unique index, not a wide WITHOUT ROWID table keyed
# by random goal ids (issue #10 measured 5.3 vs 16 us per row inserted; in tools/bench_rebuild.py the gain was
# small, goals + runs 4.65 -> 4.50 CPU s per 1M events, as most rows are written once per batch).
_INDEX: Final = "CREATE UNIQUE INDEX IF NOT EXISTS runs_key ON runs (goal_id, run_id)"
_ENDED_BY: Final = {
    "run.completed": "completed",
    "run.failed": "failed",
    "run.fell_back": "fell-back",
    "run.recovered": "recovered",
    "run.started": "superseded",
    "goal.budget_exhausted": "budget_stopped",
}
_RUN_TYPES: Final = frozenset(
    c.event_type for c in (r.RunStarted, r.RunIdleCandidate, r.RunFailed, r.RunStuck, r.RunConfirmFailed)
) | {g.GoalUsageAccounted.event_type}


_COLUMNS: Final = (
    "goal_id", "run_id", "generation", "turn", "kind", "charged", "prompt_message_id", "status", "end_event",
    "error", "failure_source", "consecutive_failures", "retry_after", "tokens", "cost", "idle_candidate_at",
    "stuck_seconds", "watchdog", "confirm_failed", "started_at", "ended_at", "started_position", "ended_position",
)  # fmt: skip
_SELECT: Final = f"SELECT {', '.join(_COLUMNS)} FROM runs WHERE goal_id = ? AND run_id = ?"
_INSERT: Final = f"INSERT INTO runs ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})"
_WRITE: Final = (
    f"INSERT OR REPLACE INTO runs ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})"
)
(_STATUS, _END_EVENT, _ERROR, _SOURCE, _FAILURES, _RETRY, _TOKENS, _COST, _IDLE, _STUCK, _WATCHDOG, _ENDED_AT,
 _ENDED_POSITION) = (_COLUMNS.index(c) for c in (
    "status", "end_event", "error", "failure_source", "consecutive_failures", "retry_after", "tokens", "cost",
    "idle_candidate_at", "stuck_seconds", "watchdog", "ended_at", "ended_position"))  # fmt: skip


class Runs:
    """Rows of ``runs``: (goal_id, run_id) -> generation, turn, kind, status, end, failure, usage, times."""

    name = "runs"
    version = 3  # 2: a rowid table with a unique index on (goal_id, run_id); 3: budget_stopped
    rebuild_cost = 3.8  # CPU s per 1M events of tools/bench_rebuild.py, alone: balances a parallel rebuild
    rebuild_affinity = (
        "goal_fold"  # rebuilt in the same process as the other goal-fold model (one fold shared)
    )
    folds = GoalFolds("runs_fold")

    def schema(self, conn: sqlite3.Connection) -> None:
        conn.execute(_DDL)
        conn.execute(_INDEX)
        self.folds.schema(conn)

    def apply(self, conn: sqlite3.Connection, envelope: Envelope) -> None:
        self.apply_batch(conn, (envelope,))

    def apply_batch(self, conn: sqlite3.Connection, envelopes: Sequence[Envelope]) -> None:
        """Fold each goal's group once, read each event's effect off the fold's marks, write each row once."""
        rows = _Rows(conn)
        for folded in self.folds.fold(conn, goal_groups(envelopes)):
            goal_id = folded.goal_id
            before, refused = folded.start
            for env, after, anomalies in zip(folded.group, folded.runs, folded.anomalies, strict=True):
                if anomalies == refused:  # refused events change no run
                    _effect(rows, goal_id, env, before, after)
                before, refused = after, anomalies
        rows.flush()

    def reset(self, conn: sqlite3.Connection) -> None:
        conn.execute("DROP TABLE IF EXISTS runs")
        self.folds.reset(conn)


class _Rows:
    """The ``runs`` rows one batch touches, read at most once and written once (as ``UPDATE``s would leave them).

    A started run is not looked up first: it is written with a plain ``INSERT``, so a run that already exists
    fails the batch exactly as the event-by-event ``INSERT`` would fail (the projector then parks that event).
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.rows: dict[tuple[str, str], list[Any] | None] = {}
        self.dirty: set[tuple[str, str]] = set()
        self.new: set[tuple[str, str]] = set()

    def touch(self, goal_id: str, run_id: str) -> list[Any] | None:
        """The row to change in place (None when there is none, as an ``UPDATE`` would match nothing)."""
        key = (goal_id, run_id)
        try:
            row = self.rows[key]
        except KeyError:
            found = self.conn.execute(_SELECT, key).fetchone()
            row = self.rows[key] = None if found is None else list(found)
        if row is not None:
            self.dirty.add(key)
        return row

    def insert(self, row: list[Any]) -> None:
        key = (row[0], row[1])
        if self.rows.get(key) is not None:
            raise sqlite3.IntegrityError("UNIQUE constraint failed: runs.goal_id, runs.run_id")
        self.rows[key] = row
        self.new.add(key)

    def flush(self) -> None:
        rows, new = self.rows, self.new
        self.conn.executemany(_INSERT, [row for key in new if (row := rows[key]) is not None])
        self.conn.executemany(_WRITE, [row for key in self.dirty - new if (row := rows[key]) is not None])
        self.dirty.clear()
        new.clear()

    def sql(self, statement: str, params: tuple[Any, ...]) -> None:
        """A statement on rows not found by key: write what is pending first, then forget it."""
        self.flush()
        self.rows.clear()
        self.conn.execute(statement, params)


def _effect(rows: _Rows, goal_id: str, env: Envelope, before: str | None, after: str | None) -> None:
    if before is not None and after != before:
        row = rows.touch(goal_id, before)
        if row is not None and row[_STATUS] == "running":
            row[_STATUS] = _ENDED_BY.get(env.type, "interrupted")
            row[_END_EVENT], row[_ENDED_AT], row[_ENDED_POSITION] = env.type, when("", env), env.position
    if env.type not in _RUN_TYPES:
        return
    e = payload(env)
    if isinstance(e, r.RunStarted):
        rows.insert([
            goal_id, e.run_id, e.generation, e.turn_count, e.kind, int(e.charged), e.prompt_message_id, "running",
            None, None, None, None, None, 0, 0.0, None, None, None, None, when(e.at, env), None, env.position, None,
        ])  # fmt: skip
    elif isinstance(e, r.RunFailed):
        if (row := rows.touch(goal_id, e.run_id)) is not None:
            row[_ERROR], row[_SOURCE], row[_FAILURES] = e.error, e.source, e.consecutive_failures
            row[_RETRY] = stamp_or_none(e.retry_after)
    elif isinstance(e, r.RunIdleCandidate):
        if (row := rows.touch(goal_id, e.run_id)) is not None:
            row[_IDLE] = when(e.at, env)
    elif isinstance(e, r.RunStuck):
        if (row := rows.touch(goal_id, e.run_id)) is not None:
            row[_STUCK], row[_WATCHDOG] = e.stuck_seconds, e.watchdog
    elif isinstance(e, r.RunConfirmFailed):
        rows.sql(
            "UPDATE runs SET confirm_failed = ? WHERE goal_id = ? AND generation = ?",
            (e.reason, goal_id, e.generation),
        )
    elif isinstance(e, g.GoalUsageAccounted) and before is not None:
        if (row := rows.touch(goal_id, before)) is not None:
            row[_TOKENS] += e.token_delta
            row[_COST] += e.cost_delta
