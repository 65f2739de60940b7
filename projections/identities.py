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
from typing import TYPE_CHECKING, Any, Final

from loopd_es.domain.streams import GOAL_PREFIX
from loopd_es.events import goal as g
from loopd_es.events import identity as i
from loopd_es.events import saga as s
from loopd_es.events.catalogue import decode_payload

from ._fold import when

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


class Identities:
    """Rows of ``identity_switches`` and ``identity_history`` (see the module docstring)."""

    name = "identities"
    version = 1

    def schema(self, conn: sqlite3.Connection) -> None:
        for ddl in _DDL:
            conn.execute(ddl)

    def apply_batch(self, conn: sqlite3.Connection, envelopes: Sequence[Envelope]) -> None:
        for env in envelopes:
            self.apply(conn, env)

    def apply(self, conn: sqlite3.Connection, envelope: Envelope) -> None:
        stream = envelope.stream
        if stream.startswith(GOAL_PREFIX):
            if envelope.type in _GOAL_TYPES:
                e = decode_payload(envelope)
                _Apply(conn, envelope, e).goal_event(e)
        elif stream.startswith(SWITCH_PREFIX) and envelope.type.startswith("saga."):
            e = decode_payload(envelope)
            _Apply(conn, envelope, e).saga_event(e)

    def reset(self, conn: sqlite3.Connection) -> None:
        for table in _TABLES:
            conn.execute(f"DROP TABLE IF EXISTS {table}")


class _Apply:
    """One event's changes to the identity tables."""

    def __init__(self, conn: sqlite3.Connection, env: Envelope, e: Any) -> None:
        self.conn = conn
        self.env = env
        self.at = when(getattr(e, "at", ""), env)  # the payload's time when it has one

    def goal_event(self, e: Any) -> None:
        if isinstance(e, g.GoalCreated):
            self.conn.execute(
                "INSERT OR REPLACE INTO identity_owners (goal_id, owner) VALUES (?, ?)",
                (e.goal_id, e.owner_session_id),
            )
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
            self.conn.execute(
                "UPDATE identity_switches SET from_model = coalesce(?, from_model), "
                "from_agent = coalesce(?, from_agent) WHERE switch_id = ?",
                (e.from_model, e.from_agent, e.switch_id),
            )
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
        by = e.requested_by or self._owner(e.goal_id)
        if e.pending and e.reason == "quota":
            by = "fallback"
        elif e.pending:
            row = self.conn.execute(
                "SELECT switch_id, requested_by FROM identity_switches WHERE goal_id = ? AND status = 'deferred' "
                "AND target = ? AND model IS ? AND agent IS ? ORDER BY last_position DESC LIMIT 1",
                (e.goal_id, _target(e.model, e.agent), e.model, e.agent),
            ).fetchone()
            if row is not None:
                pending_of, by = row
                self.conn.execute(
                    "UPDATE identity_switches SET continued_as = ?, status = 'requested', updated_at = ?, "
                    "last_position = ? WHERE switch_id = ?",
                    (e.switch_id, self.env.recorded_at, self.env.position, pending_of),
                )
        self._insert(e.goal_id, e.switch_id, e.model, e.agent, e.reason, by, resume=e.resume,
                     pending=e.pending, pending_of=pending_of, status="requested", at=e.at)  # fmt: skip
        detail = f"applies deferred switch {pending_of}" if pending_of else ("resume" if e.resume else None)
        self._history(e.goal_id, e.switch_id, "requested", e.model, e.agent, detail, by=by, reason=e.reason)

    def _deferred(self, e: i.IdentitySwitchDeferred) -> None:
        target = _target(e.model, e.agent)
        replaced = ("model", "agent", "identity") if target == "identity" else (target,)
        self._close_deferred(e.goal_id, replaced, "replaced")
        by = self._owner(e.goal_id)
        self._insert(e.goal_id, e.switch_id, e.model, e.agent, e.reason, by, resume=False, pending=False,
                     pending_of=None, status="deferred", at=e.at)  # fmt: skip
        self._history(e.goal_id, e.switch_id, "deferred", e.model, e.agent,
                      "worker busy: applies at the next permitted idle turn", by=by, reason=e.reason)  # fmt: skip

    def saga_event(self, e: Any) -> None:
        if isinstance(e, s.SwitchSagaStarted):
            self._switch(e.goal_id, e.switch_id, model=e.model, agent=e.agent)
            self.conn.execute(
                "UPDATE identity_switches SET from_model = ?, from_agent = ? WHERE switch_id = ?",
                (e.from_model, e.from_agent, e.switch_id),
            )
            detail = f"session {e.session_id or '-'}, rollback target {e.from_model or '-'} / {e.from_agent or '-'}"
            self._history(e.goal_id, e.switch_id, "saga-started", e.model, e.agent, detail)
            return
        goal_id = self._goal_of(e.switch_id)
        if goal_id is None:
            return  # a saga step before its start: nothing to attach it to
        if isinstance(e, s.HostCallIntended):
            self.conn.execute(
                "UPDATE identity_switches SET host_calls = host_calls + 1 WHERE switch_id = ?", (e.switch_id,)
            )
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
            self.conn.execute(
                "UPDATE identity_switches SET saga_outcome = ?, recovered = ? WHERE switch_id = ?",
                (e.outcome, int(e.recovered), e.switch_id),
            )
            detail = e.outcome + (" (settled by recovery)" if e.recovered else "")
            self._history(goal_id, e.switch_id, "saga-finished", None, None, detail)

    # -- rows -----------------------------------------------------------------------------------------

    def _owner(self, goal_id: str) -> str:
        row = self.conn.execute("SELECT owner FROM identity_owners WHERE goal_id = ?", (goal_id,)).fetchone()
        return str(row[0]) if row else ""

    def _goal_of(self, switch_id: str) -> str | None:
        row = self.conn.execute(
            "SELECT goal_id FROM identity_switches WHERE switch_id = ?", (switch_id,)
        ).fetchone()
        return None if row is None else str(row[0])

    def _insert(
        self, goal_id: str, switch_id: str, model: str | None, agent: str | None, reason: str, by: str, *,
        resume: bool, pending: bool, pending_of: str | None, status: str, at: str,
    ) -> None:  # fmt: skip
        env = self.env
        self.conn.execute(
            "INSERT OR REPLACE INTO identity_switches (switch_id, goal_id, target, model, agent, reason, "
            "requested_by, resume, pending, pending_of, status, host_calls, recovered, requested_at, "
            "updated_at, last_position) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 0, ?, ?, ?)",
            (switch_id, goal_id, _target(model, agent), model, agent, reason, by, int(resume), int(pending),
             pending_of, status, when(at, env), env.recorded_at, env.position),
        )  # fmt: skip

    def _switch(
        self, goal_id: str, switch_id: str, *, model: str | None = None, agent: str | None = None,
        target: str | None = None, reason: str = "owner",
    ) -> None:  # fmt: skip
        """Make sure the switch has a row (an outcome whose request is not in this log still gets one)."""
        if self._goal_of(switch_id) is None:
            self._insert(goal_id, switch_id, model, agent, reason, self._owner(goal_id), resume=False,
                         pending=False, pending_of=None, status="requested", at="")  # fmt: skip
            if target is not None:
                self.conn.execute(
                    "UPDATE identity_switches SET target = ? WHERE switch_id = ?", (target, switch_id)
                )

    def _status(
        self, switch_id: str, status: str, *, stage: str | None = None, failure: str | None = None
    ) -> None:
        """Set the status of the switch and of the deferred switch it continues."""
        env = self.env
        self.conn.execute(
            "UPDATE identity_switches SET status = ?, stage = coalesce(?, stage), "
            "failure_reason = coalesce(?, failure_reason), updated_at = ?, last_position = ? "
            "WHERE switch_id = ? OR continued_as = ?",
            (status, stage, failure, env.recorded_at, env.position, switch_id, switch_id),
        )

    def _close_deferred(self, goal_id: str, targets: Sequence[str], status: str) -> None:
        env = self.env
        marks = ", ".join("?" * len(targets))
        self.conn.execute(
            f"UPDATE identity_switches SET status = ?, updated_at = ?, last_position = ? "
            f"WHERE goal_id = ? AND status = 'deferred' AND target IN ({marks})",
            (status, env.recorded_at, env.position, goal_id, *targets),
        )

    def _history(
        self, goal_id: str, switch_id: str | None, event: str, model: str | None, agent: str | None,
        detail: str | None, *, by: str | None = None, reason: str | None = None,
    ) -> None:  # fmt: skip
        env = self.env
        if by is None and switch_id is not None:  # every line says who asked and why, not only the request
            row = self.conn.execute(
                "SELECT requested_by, reason FROM identity_switches WHERE switch_id = ?", (switch_id,)
            ).fetchone()
            by, reason = row if row is not None else (None, None)
        self.conn.execute(
            "INSERT INTO identity_history (position, goal_id, switch_id, event, model, agent, requested_by, "
            "reason, detail, at, correlation_id, causation_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (env.position, goal_id, switch_id, event, model, agent, by, reason, detail, self.at,
             env.correlation_id, env.causation_id),
        )  # fmt: skip


def _op(key: str) -> str:
    """``<switch>/<purpose>/<op>`` -> ``<purpose> <op>``."""
    parts = key.rsplit("/", 2)
    return " ".join(parts[-2:]) if len(parts) == 3 else key
