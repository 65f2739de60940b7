"""``runs``: one row per worker run (turn) of every goal, from its start to how it ended.

The projection folds the goal stream with the domain's fold (state kept in ``runs_fold``) and looks at each
event's effect: an event the fold refuses (a stale run, an event after ``goal.cleared``) changes no row, and
a run ends exactly when the folded state stops naming it as the active run, whichever event did that
(``run.completed``, ``run.failed``, a pause, a block, a newer run...). So ``goals.phase = 'running'`` and a
``running`` row here always agree.

Statuses: ``running``, ``completed``, ``failed``, ``recovered`` (maintenance released a quiet run),
``superseded`` (a newer run started), ``interrupted`` (a goal event released it; ``end_event`` says which).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from loopd_es.domain.evolve import GoalFold
from loopd_es.events import goal as g
from loopd_es.events import run as r
from loopd_es.events.catalogue import decode_payload

from ._fold import GoalFolds, goal_groups, when

if TYPE_CHECKING:
    from loopd_es.domain.state import GoalState
    from loopd_es.events.envelope import Envelope

_DDL: Final = """CREATE TABLE IF NOT EXISTS runs (
    goal_id TEXT NOT NULL, run_id TEXT NOT NULL, generation INTEGER NOT NULL, turn INTEGER NOT NULL,
    kind TEXT NOT NULL, charged INTEGER NOT NULL, prompt_message_id TEXT NOT NULL,
    status TEXT NOT NULL, end_event TEXT, error TEXT, failure_source TEXT, consecutive_failures INTEGER,
    retry_after TEXT, tokens INTEGER NOT NULL, cost REAL NOT NULL, idle_candidate_at TEXT,
    stuck_seconds REAL, watchdog TEXT, confirm_failed TEXT,
    started_at TEXT NOT NULL, ended_at TEXT, started_position INTEGER NOT NULL, ended_position INTEGER,
    PRIMARY KEY (goal_id, run_id)
) WITHOUT ROWID"""
_ENDED_BY: Final = {
    "run.completed": "completed",
    "run.failed": "failed",
    "run.recovered": "recovered",
    "run.started": "superseded",
}
_RUN_TYPES: Final = frozenset(
    c.event_type for c in (r.RunStarted, r.RunIdleCandidate, r.RunFailed, r.RunStuck, r.RunConfirmFailed)
) | {g.GoalUsageAccounted.event_type}


class Runs:
    """Rows of ``runs``: (goal_id, run_id) -> generation, turn, kind, status, end, failure, usage, times."""

    name = "runs"
    version = 1
    folds = GoalFolds("runs_fold")

    def schema(self, conn: sqlite3.Connection) -> None:
        conn.execute(_DDL)
        self.folds.schema(conn)

    def apply(self, conn: sqlite3.Connection, envelope: Envelope) -> None:
        self.apply_batch(conn, (envelope,))

    def apply_batch(self, conn: sqlite3.Connection, envelopes: Sequence[Envelope]) -> None:
        """Fold each goal's events one at a time (one load and save per goal) and record each effect."""
        for goal_id, group in goal_groups(envelopes).items():
            state = self.folds.load(conn, goal_id)
            folding = GoalFold(state)
            for env in group:
                folding.apply((env,))
                after = folding.result()
                if after.anomaly_count == state.anomaly_count:  # refused events change no run
                    _effect(conn, env, state, after)
                state = after
            self.folds.save(conn, state)

    def reset(self, conn: sqlite3.Connection) -> None:
        conn.execute("DROP TABLE IF EXISTS runs")
        self.folds.reset(conn)


def _effect(conn: sqlite3.Connection, env: Envelope, before: GoalState, after: GoalState) -> None:
    goal_id = after.goal_id
    ended = before.active_run_id
    if ended is not None and after.active_run_id != ended:
        conn.execute(
            "UPDATE runs SET status = ?, end_event = ?, ended_at = ?, ended_position = ? "
            "WHERE goal_id = ? AND run_id = ? AND status = 'running'",
            (_ENDED_BY.get(env.type, "interrupted"), env.type, env.recorded_at, env.position, goal_id, ended),
        )
    if env.type not in _RUN_TYPES:
        return
    e = decode_payload(env)
    if isinstance(e, r.RunStarted):
        conn.execute(
            "INSERT INTO runs (goal_id, run_id, generation, turn, kind, charged, prompt_message_id, status, "
            "tokens, cost, started_at, started_position) VALUES (?, ?, ?, ?, ?, ?, ?, 'running', 0, 0.0, ?, ?)",
            (goal_id, e.run_id, e.generation, e.turn_count, e.kind, int(e.charged), e.prompt_message_id,
             when(e.at, env), env.position),
        )  # fmt: skip
    elif isinstance(e, r.RunFailed):
        conn.execute(
            "UPDATE runs SET error = ?, failure_source = ?, consecutive_failures = ?, retry_after = ? "
            "WHERE goal_id = ? AND run_id = ?",
            (e.error, e.source, e.consecutive_failures, e.retry_after, goal_id, e.run_id),
        )
    elif isinstance(e, r.RunIdleCandidate):
        conn.execute(
            "UPDATE runs SET idle_candidate_at = ? WHERE goal_id = ? AND run_id = ?",
            (when(e.at, env), goal_id, e.run_id),
        )
    elif isinstance(e, r.RunStuck):
        conn.execute(
            "UPDATE runs SET stuck_seconds = ?, watchdog = ? WHERE goal_id = ? AND run_id = ?",
            (e.stuck_seconds, e.watchdog, goal_id, e.run_id),
        )
    elif isinstance(e, r.RunConfirmFailed):
        conn.execute(
            "UPDATE runs SET confirm_failed = ? WHERE goal_id = ? AND generation = ?",
            (e.reason, goal_id, e.generation),
        )
    elif isinstance(e, g.GoalUsageAccounted) and before.active_run_id is not None:
        conn.execute(
            "UPDATE runs SET tokens = tokens + ?, cost = cost + ? WHERE goal_id = ? AND run_id = ?",
            (e.token_delta, e.cost_delta, goal_id, before.active_run_id),
        )
