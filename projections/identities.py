"""``identities``: every identity switch of every goal, who asked for it, why, and how it ended.

Two tables:

``identity_switches``  one row per ``switch_id``: what was asked (model, agent, target), by whom
                       (``requested_by``: the owner session, ``fallback`` for a provider-limit fallback), why
                       (``reason``: owner / quota), from which identity, and its ``status``: requested,
                       deferred, replaced, superseded, dropped, unsupported, applied, next-prompt, failed,
                       rolled-back, rollback-failed; plus the saga's host calls and outcome.
``identity_history``   one row per identity or switch-saga event, in log order: the timeline ``loopd-es
                       identities GOAL`` prints.

A deferred switch is applied later under a new switch id (``requested_by = 'pending'`` in the event); the
row of that request names the deferred one in ``pending_of``, the deferred row names it in
``continued_as`` and from then on shows its status. The match is the goal's latest deferred switch of the
same target and identity, which is what the goal's pending slot held.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

from loopd_es.domain.streams import GOAL_PREFIX
from loopd_es.events import goal as g
from loopd_es.events import identity as i
from loopd_es.events import saga as s

from ._base import BatchModel
from ._fold import payload, when

if TYPE_CHECKING:
    from loopd_es.events.envelope import Envelope

SWITCH_PREFIX: Final = "switch-"
_DDL: Final = (
    """CREATE TABLE IF NOT EXISTS identity_switches (
        switch_id TEXT PRIMARY KEY, goal_id TEXT NOT NULL, target TEXT NOT NULL, model TEXT, agent TEXT,
        from_model TEXT, from_agent TEXT, reason TEXT NOT NULL, requested_by TEXT NOT NULL,
        resume INTEGER NOT NULL, pending INTEGER NOT NULL, pending_of TEXT, continued_as TEXT,
        status TEXT NOT NULL, stage TEXT, failure_reason TEXT, host_calls INTEGER NOT NULL,
        saga_outcome TEXT, recovered INTEGER NOT NULL, requested_at TEXT NOT NULL, updated_at TEXT NOT NULL,
        last_position INTEGER NOT NULL
    ) WITHOUT ROWID""",
    "CREATE INDEX IF NOT EXISTS identity_switches_by_goal ON identity_switches (goal_id, requested_at)",
    "CREATE INDEX IF NOT EXISTS identity_switches_deferred ON identity_switches (goal_id) WHERE status = 'deferred'",
    "CREATE INDEX IF NOT EXISTS identity_switches_continued ON identity_switches (continued_as) "
    "WHERE continued_as IS NOT NULL",
    """CREATE TABLE IF NOT EXISTS identity_history (
        position INTEGER PRIMARY KEY, goal_id TEXT NOT NULL, switch_id TEXT, event TEXT NOT NULL,
        model TEXT, agent TEXT, requested_by TEXT, reason TEXT, detail TEXT, at TEXT NOT NULL,
        correlation_id TEXT, causation_id TEXT
    )""",
    "CREATE INDEX IF NOT EXISTS identity_history_by_goal ON identity_history (goal_id, position)",
    "CREATE TABLE IF NOT EXISTS identity_owners (goal_id TEXT PRIMARY KEY, owner TEXT NOT NULL) WITHOUT ROWID",
)
_TABLES: Final = ("identity_switches", "identity_history", "identity_owners")
_GOAL_TYPES: Final = frozenset(
    c.event_type
    for c in (
        g.GoalCreated, g.GoalCleared, i.IdentitySwitchRequested, i.IdentitySwitchDeferred,
        i.IdentitySwitchUnsupported, i.IdentitySwitchApplied, i.IdentitySwitchFailed,
        i.IdentitySwitchRolledBack, i.IdentityRollbackFailed,
    )
)  # fmt: skip


def _target(model: str | None, agent: str | None) -> str:
    if model is not None and agent is not None:
        return "identity"
    return "model" if model is not None else "agent"


class Identities(BatchModel):
    """Rows of ``identity_switches`` and ``identity_history`` (see the module docstring)."""

    name = "identities"
    version = 2  # 2: indexes for the deferred switches of a goal and for continued_as (rows unchanged)
    rebuild_cost = 2.1  # CPU s per 1M events of tools/bench_rebuild.py, alone: balances a parallel rebuild
    DDL = _DDL
    TABLES = _TABLES

    def apply_batch(self, conn: sqlite3.Connection, envelopes: Sequence[Envelope]) -> None:
        """Every event against rows held in memory for the batch; each changed row is written once at the end."""
        tables = _Tables(conn)
        for env in envelopes:
            type_ = env.type  # most events are neither: one set lookup and one prefix test each
            if type_ in _GOAL_TYPES:
                if env.stream.startswith(GOAL_PREFIX):
                    e = payload(env)
                    _Apply(tables, env, e).goal_event(e)
            elif type_.startswith("saga.") and env.stream.startswith(SWITCH_PREFIX):
                e = payload(env)
                _Apply(tables, env, e).saga_event(e)
        tables.flush()


Row = list[Any]
(_SWITCH_ID, _GOAL_ID, _TARGET, _MODEL, _AGENT, _FROM_MODEL, _FROM_AGENT, _REASON, _REQUESTED_BY, _RESUME, _PENDING,
 _PENDING_OF, _CONTINUED_AS, _STATUS, _STAGE, _FAILURE, _HOST_CALLS, _SAGA_OUTCOME, _RECOVERED, _REQUESTED_AT,
 _UPDATED_AT, _LAST_POSITION) = range(22)  # fmt: skip
_SWITCH_COLUMNS: Final = (
    "switch_id, goal_id, target, model, agent, from_model, from_agent, reason, requested_by, resume, pending, "
    "pending_of, continued_as, status, stage, failure_reason, host_calls, saga_outcome, recovered, requested_at, "
    "updated_at, last_position"
)
_SELECT: Final = f"SELECT {_SWITCH_COLUMNS} FROM identity_switches WHERE "
_WRITE_SWITCH: Final = (
    f"INSERT OR REPLACE INTO identity_switches ({_SWITCH_COLUMNS}) VALUES ({', '.join('?' * 22)})"
)
_WRITE_HISTORY: Final = (
    "INSERT INTO identity_history (position, goal_id, switch_id, event, model, agent, requested_by, reason, detail, "
    "at, correlation_id, causation_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


class _Tables:
    """The identity rows one batch reads and changes, in memory; what the SQL of one event at a time would do.

    A switch row is read at most once per batch (by id, or with its goal's deferred switches, or with the
    switches continued as a given id: the two other ways rows are looked up) and written once. A row already
    held is always the truth: a lookup never overwrites it with the older stored copy.
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.switches: dict[str, Row | None] = {}
        self.dirty: set[str] = set()
        self.by_goal: dict[str, set[str]] = {}  # goal -> held switches (filter on their goal_id and status)
        self.by_continued: dict[str, set[str]] = {}  # switch -> held switches continued as it
        self.goals_read: set[str] = set()
        self.continued_read: set[str] = set()
        self.owners: dict[str, str | None] = {}
        self.new_owners: set[str] = set()
        self.history: list[tuple[Any, ...]] = []

    def _hold(self, rows: list[Any]) -> None:
        for found in rows:
            sid = found[_SWITCH_ID]
            if sid not in self.switches:
                row = self.switches[sid] = list(found)
                self.by_goal.setdefault(row[_GOAL_ID], set()).add(sid)
                if row[_CONTINUED_AS] is not None:
                    self.by_continued.setdefault(row[_CONTINUED_AS], set()).add(sid)

    def switch(self, switch_id: str) -> Row | None:
        try:
            return self.switches[switch_id]
        except KeyError:
            found = self.conn.execute(_SELECT + "switch_id = ?", (switch_id,)).fetchall()
            self._hold(found)
            return self.switches.setdefault(switch_id, None)

    def put(self, row: Row) -> None:
        """``INSERT OR REPLACE`` of a whole row."""
        sid = row[_SWITCH_ID]
        self.switches[sid] = row
        self.dirty.add(sid)
        self.by_goal.setdefault(row[_GOAL_ID], set()).add(sid)

    def changed(self, row: Row) -> None:
        self.dirty.add(row[_SWITCH_ID])

    def deferred(self, goal_id: str) -> list[Row]:
        """The goal's switches with status ``deferred``."""
        if goal_id not in self.goals_read:
            self.goals_read.add(goal_id)
            self._hold(
                self.conn.execute(_SELECT + "goal_id = ? AND status = 'deferred'", (goal_id,)).fetchall()
            )
        rows = (self.switches[sid] for sid in self.by_goal.get(goal_id, ()))
        return [
            row for row in rows if row is not None and row[_GOAL_ID] == goal_id and row[_STATUS] == "deferred"
        ]

    def continued(self, switch_id: str) -> list[Row]:
        """The switches whose ``continued_as`` is ``switch_id``."""
        if switch_id not in self.continued_read:
            self.continued_read.add(switch_id)
            self._hold(self.conn.execute(_SELECT + "continued_as = ?", (switch_id,)).fetchall())
        rows = (self.switches[sid] for sid in self.by_continued.get(switch_id, ()))
        return [row for row in rows if row is not None and row[_CONTINUED_AS] == switch_id]

    def continue_as(self, row: Row, switch_id: str) -> None:
        row[_CONTINUED_AS] = switch_id
        self.by_continued.setdefault(switch_id, set()).add(row[_SWITCH_ID])
        self.dirty.add(row[_SWITCH_ID])

    def owner(self, goal_id: str) -> str:
        try:
            owner = self.owners[goal_id]
        except KeyError:
            row = self.conn.execute(
                "SELECT owner FROM identity_owners WHERE goal_id = ?", (goal_id,)
            ).fetchone()
            owner = self.owners[goal_id] = None if row is None else str(row[0])
        return owner or ""

    def set_owner(self, goal_id: str, owner: str) -> None:
        self.owners[goal_id] = owner
        self.new_owners.add(goal_id)

    def flush(self) -> None:
        conn, switches, owners = self.conn, self.switches, self.owners
        conn.executemany(_WRITE_SWITCH, [row for sid in self.dirty if (row := switches[sid]) is not None])
        conn.executemany(_WRITE_HISTORY, self.history)
        conn.executemany(
            "INSERT OR REPLACE INTO identity_owners (goal_id, owner) VALUES (?, ?)",
            [(goal_id, owners[goal_id]) for goal_id in self.new_owners],
        )


class _Apply:
    """One event's changes to the identity tables."""

    def __init__(self, tables: _Tables, env: Envelope, e: Any) -> None:
        self.t = tables
        self.env = env
        self.at = when(getattr(e, "at", ""), env)  # the payload's time when it has one

    def goal_event(self, e: Any) -> None:
        if isinstance(e, g.GoalCreated):
            self.t.set_owner(e.goal_id, e.owner_session_id)
        elif isinstance(e, g.GoalCleared):
            self._close_deferred(e.goal_id, ("model", "agent", "identity"), "dropped")
        elif isinstance(e, i.IdentitySwitchRequested):
            self._requested(e)
        elif isinstance(e, i.IdentitySwitchDeferred):
            self._deferred(e)
        elif isinstance(e, i.IdentitySwitchUnsupported):
            self._switch(e.goal_id, e.switch_id, model=e.model, agent=e.agent)
            self._status(e.switch_id, "unsupported")
            self._history(e.goal_id, e.switch_id, "unsupported", e.model, e.agent, "the host cannot switch")
        elif isinstance(e, i.IdentitySwitchApplied):
            self._switch(e.goal_id, e.switch_id, model=e.to_model, agent=e.to_agent, reason=e.reason)
            row = self.t.switch(e.switch_id)
            if row is not None:
                row[_FROM_MODEL] = e.from_model if e.from_model is not None else row[_FROM_MODEL]
                row[_FROM_AGENT] = e.from_agent if e.from_agent is not None else row[_FROM_AGENT]
                self.t.changed(row)
            self._status(e.switch_id, e.outcome)
            superseded = {"model": ("model",), "agent": ("agent",), "identity": ("identity",)}[e.target]
            self._close_deferred(e.goal_id, superseded, "superseded")
            shown = f"from {e.from_model or '-'} / {e.from_agent or '-'}" + (
                " (with the next prompt)" if e.outcome == "next-prompt" else ""
            )
            self._history(e.goal_id, e.switch_id, e.outcome, e.to_model, e.to_agent, shown)
        elif isinstance(e, i.IdentitySwitchFailed):
            self._switch(e.goal_id, e.switch_id, target=e.target)
            self._status(e.switch_id, "failed", stage=e.stage, failure=e.reason)
            pending = " (pending switch: goal blocked)" if e.pending else ""
            self._history(e.goal_id, e.switch_id, "failed", None, None, f"{e.stage}: {e.reason}{pending}")
        elif isinstance(e, i.IdentitySwitchRolledBack | i.IdentityRollbackFailed):
            rolled = isinstance(e, i.IdentitySwitchRolledBack)
            status = "rolled-back" if rolled else "rollback-failed"
            self._switch(e.goal_id, e.switch_id)
            self._status(e.switch_id, status)
            detail = "switched back" if rolled else "switching back failed: inspect the live session"
            self._history(e.goal_id, e.switch_id, status, e.model, e.agent, detail)

    def _requested(self, e: i.IdentitySwitchRequested) -> None:
        pending_of = None
        by = e.requested_by or self.t.owner(e.goal_id)
        if e.pending and e.reason == "quota":
            by = "fallback"
        elif e.pending:
            target = _target(e.model, e.agent)
            match = [
                row for row in self.t.deferred(e.goal_id)
                if row[_TARGET] == target and row[_MODEL] == e.model and row[_AGENT] == e.agent
            ]  # fmt: skip
            if match:
                row = max(match, key=lambda row: row[_LAST_POSITION])  # the latest deferred switch
                pending_of, by = row[_SWITCH_ID], row[_REQUESTED_BY]
                self.t.continue_as(row, e.switch_id)
                row[_STATUS], row[_UPDATED_AT], row[_LAST_POSITION] = (
                    "requested",
                    when("", self.env),
                    self.env.position,
                )
        self._insert(e.goal_id, e.switch_id, e.model, e.agent, e.reason, by, resume=e.resume,
                     pending=e.pending, pending_of=pending_of, status="requested", at=e.at)  # fmt: skip
        detail = f"applies deferred switch {pending_of}" if pending_of else ("resume" if e.resume else None)
        self._history(e.goal_id, e.switch_id, "requested", e.model, e.agent, detail, by=by, reason=e.reason)

    def _deferred(self, e: i.IdentitySwitchDeferred) -> None:
        target = _target(e.model, e.agent)
        replaced = ("model", "agent", "identity") if target == "identity" else (target,)
        self._close_deferred(e.goal_id, replaced, "replaced")
        by = self.t.owner(e.goal_id)
        self._insert(e.goal_id, e.switch_id, e.model, e.agent, e.reason, by, resume=False, pending=False,
                     pending_of=None, status="deferred", at=e.at)  # fmt: skip
        self._history(e.goal_id, e.switch_id, "deferred", e.model, e.agent,
                      "worker busy: applies at the next permitted idle turn", by=by, reason=e.reason)  # fmt: skip

    def saga_event(self, e: Any) -> None:
        t = self.t
        if isinstance(e, s.SwitchSagaStarted):
            self._switch(e.goal_id, e.switch_id, model=e.model, agent=e.agent)
            row = t.switch(e.switch_id)
            if row is not None:
                row[_FROM_MODEL], row[_FROM_AGENT] = e.from_model, e.from_agent
                t.changed(row)
            detail = f"session {e.session_id or '-'}, rollback target {e.from_model or '-'} / {e.from_agent or '-'}"
            self._history(e.goal_id, e.switch_id, "saga-started", e.model, e.agent, detail)
            return
        row = t.switch(e.switch_id)
        if row is None:
            return  # a saga step before its start: nothing to attach it to
        goal_id: str = row[_GOAL_ID]
        if isinstance(e, s.HostCallIntended):
            row[_HOST_CALLS] += 1
            t.changed(row)
            self._history(goal_id, e.switch_id, "host-call", None, None, f"{e.purpose} {e.op}({e.arg})")
        elif isinstance(e, s.HostCallSucceeded):
            self._history(goal_id, e.switch_id, "host-call-ok", None, None, f"{_op(e.key)}: {e.result}")
        elif isinstance(e, s.HostCallFailed):
            self._history(goal_id, e.switch_id, "host-call-failed", None, None, f"{_op(e.key)}: {e.reason}")
        elif isinstance(e, s.HostCallResolved):
            live = f"live {e.live_model or '-'} / {e.live_agent or '-'}"
            landed = "landed" if e.landed else "did not land"
            self._history(
                goal_id, e.switch_id, "host-call-resolved", None, None, f"{_op(e.key)} {landed} ({live})"
            )
        elif isinstance(e, s.SwitchSagaFinished):
            row[_SAGA_OUTCOME], row[_RECOVERED] = e.outcome, int(e.recovered)
            t.changed(row)
            detail = e.outcome + (" (settled by recovery)" if e.recovered else "")
            self._history(goal_id, e.switch_id, "saga-finished", None, None, detail)

    # -- rows -----------------------------------------------------------------------------------------

    def _insert(
        self, goal_id: str, switch_id: str, model: str | None, agent: str | None, reason: str, by: str, *,
        resume: bool, pending: bool, pending_of: str | None, status: str, at: datetime | str | None,
    ) -> None:  # fmt: skip
        env = self.env
        self.t.put([
            switch_id, goal_id, _target(model, agent), model, agent, None, None, reason, by, int(resume),
            int(pending), pending_of, None, status, None, None, 0, None, 0, when(at, env), when("", env),
            env.position,
        ])  # fmt: skip

    def _switch(
        self, goal_id: str, switch_id: str, *, model: str | None = None, agent: str | None = None,
        target: str | None = None, reason: str = "owner",
    ) -> None:  # fmt: skip
        """Make sure the switch has a row (an outcome whose request is not in this log still gets one)."""
        if self.t.switch(switch_id) is None:
            self._insert(goal_id, switch_id, model, agent, reason, self.t.owner(goal_id), resume=False,
                         pending=False, pending_of=None, status="requested", at="")  # fmt: skip
            if target is not None:
                row = self.t.switch(switch_id)
                assert row is not None
                row[_TARGET] = target

    def _status(
        self, switch_id: str, status: str, *, stage: str | None = None, failure: str | None = None
    ) -> None:
        """Set the status of the switch and of the deferred switch it continues."""
        env, t = self.env, self.t
        row = t.switch(switch_id)
        rows = t.continued(switch_id)
        if row is not None and all(other is not row for other in rows):
            rows.append(row)
        for row in rows:
            row[_STATUS] = status
            if stage is not None:
                row[_STAGE] = stage
            if failure is not None:
                row[_FAILURE] = failure
            row[_UPDATED_AT], row[_LAST_POSITION] = when("", env), env.position
            t.changed(row)

    def _close_deferred(self, goal_id: str, targets: Sequence[str], status: str) -> None:
        env, t = self.env, self.t
        for row in t.deferred(goal_id):
            if row[_TARGET] in targets:
                row[_STATUS], row[_UPDATED_AT], row[_LAST_POSITION] = status, when("", env), env.position
                t.changed(row)

    def _history(
        self, goal_id: str, switch_id: str | None, event: str, model: str | None, agent: str | None,
        detail: str | None, *, by: str | None = None, reason: str | None = None,
    ) -> None:  # fmt: skip
        env = self.env
        if by is None and switch_id is not None:  # every line says who asked and why, not only the request
            row = self.t.switch(switch_id)
            by, reason = (row[_REQUESTED_BY], row[_REASON]) if row is not None else (None, None)
        self.t.history.append(
            (env.position, goal_id, switch_id, event, model, agent, by, reason, detail, self.at,
             env.correlation_id, env.causation_id)
        )  # fmt: skip


def _op(key: str) -> str:
    """``<switch>/<purpose>/<op>`` -> ``<purpose> <op>``."""
    parts = key.rsplit("/", 2)
    return " ".join(parts[-2:]) if len(parts) == 3 else key
