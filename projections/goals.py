"""``goals``: one row per goal with what ``loopd-es goals`` and ``goal show`` answer at a glance.

Rows come from the domain's own fold of the goal stream (state kept in ``goals_fold``), so status, phase,
identity, pending switches and budgets are exactly what the deciders see; nothing here re-states a rule.
A cleared goal keeps its row (``cleared = 1``): queries hide it unless asked.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import msgspec

from loopd_es.clock import stamp
from loopd_es.domain.options import config_options

from ._fold import GoalFolds, goal_groups, when

if TYPE_CHECKING:
    from loopd_es.domain.state import GoalState
    from loopd_es.events.base import Caller
    from loopd_es.events.envelope import Envelope

COLUMNS: Final = (
    "goal_id", "name", "objective", "owner", "status", "phase", "cleared", "interactive",
    "model", "agent", "pending_switch", "switch_in_flight", "worker_session_id",
    "turns_used", "max_turns", "runs", "tokens_used", "token_budget", "cost_used", "cost_budget",
    "time_used_seconds", "timeout_ms", "blocker_reason", "blocker_needed", "blocker_kind", "last_error",
    "last_progress", "last_progress_next", "last_progress_at", "fallback_status",
    "created_at", "updated_at", "version", "position", "anomalies", "options",
    "created_by", "ended_by", "controlled_by",
)  # fmt: skip
"""``created_by``, ``ended_by``, ``controlled_by``: the tool call (JSON: role, session, tool, message and call
ids) that created, ended (completed or blocked) or last changed the goal; NULL for the CLI or the engine."""
_DDL: Final = """CREATE TABLE IF NOT EXISTS goals (
    goal_id TEXT PRIMARY KEY, name TEXT NOT NULL, objective TEXT NOT NULL, owner TEXT NOT NULL,
    status TEXT NOT NULL, phase TEXT NOT NULL, cleared INTEGER NOT NULL, interactive INTEGER NOT NULL,
    model TEXT, agent TEXT, pending_switch TEXT, switch_in_flight TEXT, worker_session_id TEXT,
    turns_used INTEGER NOT NULL, max_turns INTEGER, runs INTEGER NOT NULL,
    tokens_used INTEGER NOT NULL, token_budget INTEGER, cost_used REAL NOT NULL, cost_budget REAL,
    time_used_seconds REAL NOT NULL, timeout_ms INTEGER,
    blocker_reason TEXT, blocker_needed TEXT, blocker_kind TEXT, last_error TEXT,
    last_progress TEXT, last_progress_next TEXT, last_progress_at TEXT, fallback_status TEXT,
    created_at TEXT NOT NULL, updated_at TEXT NOT NULL, version INTEGER NOT NULL, position INTEGER NOT NULL,
    anomalies INTEGER NOT NULL, options TEXT NOT NULL,
    created_by TEXT, ended_by TEXT, controlled_by TEXT
) WITHOUT ROWID"""
# created_at is written once, by the insert: later batches never move it.
_UPSERT: Final = (
    f"INSERT INTO goals ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))}) "
    "ON CONFLICT (goal_id) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in COLUMNS if c not in ("goal_id", "created_at"))
)


def pending_text(state: GoalState) -> str | None:
    """The pending switch in one phrase: ``model M (quota)``, ``agent A``, ``M / A`` (a pair), or None."""
    if state.pending_identity is not None:
        return f"{state.pending_identity.model} / {state.pending_identity.agent}"
    parts = []
    if state.model_pending is not None:
        pending = state.model_pending
        parts.append(
            f"model {pending.model} ({'rate limit' if pending.limit == 'rate-limit' else pending.reason})"
        )
    if state.agent_pending is not None:
        parts.append(f"agent {state.agent_pending.agent}")
    return ", ".join(parts) or None


def goal_row(state: GoalState, created_at: str, updated_at: str) -> tuple[Any, ...]:
    """The ``goals`` row of a folded state, in :data:`COLUMNS` order."""
    cfg, blocker, progress = state.config, state.blocker, state.last_progress
    return (
        state.goal_id, state.name, state.objective, state.owner_session_id, state.status, state.phase,
        int(state.cleared), int(state.interactive), cfg.model, cfg.agent, pending_text(state),
        state.switch_in_flight.switch_id if state.switch_in_flight else None, state.worker_session_id,
        state.budget_turn_count, cfg.max_turns, state.run_count, state.tokens_used, cfg.token_budget,
        state.cost_used, cfg.cost_budget, state.time_used_seconds, cfg.timeout_ms,
        blocker.reason if blocker else None, blocker.needed if blocker else None,
        blocker.kind if blocker else None, state.last_error,
        progress.summary if progress else None, progress.next if progress else None,
        stamp(progress.at) if progress else None,
        state.model_fallback.status if state.model_fallback else None,
        created_at, updated_at, state.version, state.position, state.anomaly_count,
        json.dumps(config_options(cfg)),
        caller_json(state.created_by), caller_json(state.ended_by), caller_json(state.controlled_by),
    )  # fmt: skip


def caller_json(caller: Caller | None) -> str | None:
    """A ``called_by`` as a read model stores it: its JSON object, or NULL."""
    return None if caller is None else msgspec.json.encode(caller).decode()


class Goals:
    """Rows of ``goals`` (see :data:`COLUMNS`), folded from ``goal-<id>`` streams."""

    name = "goals"
    version = 4  # 2: the fold keeps loopd's imported bookkeeping (goal show reads it); 3: options; 4: callers
    rebuild_cost = 1.6  # CPU s per 1M events of tools/bench_rebuild.py, alone: balances a parallel rebuild
    rebuild_affinity = (
        "goal_fold"  # rebuilt in the same process as the other goal-fold model (one fold shared)
    )
    folds = GoalFolds("goals_fold")

    def schema(self, conn: sqlite3.Connection) -> None:
        conn.execute(_DDL)
        conn.execute("CREATE INDEX IF NOT EXISTS goals_by_status ON goals (status, owner)")
        self.folds.schema(conn)

    def apply(self, conn: sqlite3.Connection, envelope: Envelope) -> None:
        self.apply_batch(conn, (envelope,))

    def apply_batch(self, conn: sqlite3.Connection, envelopes: Sequence[Envelope]) -> None:
        """One load, one fold and one write per goal of the batch (rows written in one executemany)."""
        rows = []
        for folded in self.folds.fold(conn, goal_groups(envelopes)):
            state, group = folded.state, folded.group
            if not (state.exists or state.cleared):
                continue  # only anomalies so far (events before goal.created): no goal to show
            created = (
                stamp(state.created_at)
                if state.created_at
                else next((when("", e) for e in group if e.type == "goal.created"), when("", group[0]))
            )
            rows.append(goal_row(state, created, when("", group[-1])))
        conn.executemany(_UPSERT, rows)

    def reset(self, conn: sqlite3.Connection) -> None:
        conn.execute("DROP TABLE IF EXISTS goals")
        self.folds.reset(conn)
