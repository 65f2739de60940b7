"""``provider_limits``: provider quota / rate-limit observations, and each goal's model-fallback state.

Two tables:

``provider_limit_observations``  one row per ``identity.provider_limit_observed`` (kind, source, model,
                                 HTTP status, retry time, whether it marked the goal's blocker)
``provider_fallbacks``           one row per goal: its configured fallback models, its current model, the
                                 fallback status (prepared / exhausted / unsupported / unavailable, as the
                                 goal fold's ``model_fallback``), the prepared model, the models attempted,
                                 and its latest observation

The fallback columns copy the fallback events' own fields (``attempted`` only grows there), so nothing here
restates the fallback rules of :mod:`loopd_es.domain.switching`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from loopd_es.domain.streams import GOAL_PREFIX
from loopd_es.events import goal as g
from loopd_es.events import identity as i
from loopd_es.events.catalogue import decode_payload

from ._fold import json_list

if TYPE_CHECKING:
    from loopd_es.events.envelope import Envelope

_DDL: Final = (
    """CREATE TABLE IF NOT EXISTS provider_limit_observations (
        position INTEGER PRIMARY KEY, goal_id TEXT NOT NULL, kind TEXT NOT NULL, source TEXT NOT NULL,
        model TEXT, status_code INTEGER, retry_at TEXT, observed_at TEXT NOT NULL, marks_blocker INTEGER NOT NULL,
        correlation_id TEXT
    )""",
    "CREATE INDEX IF NOT EXISTS provider_limit_observations_by_goal "
    "ON provider_limit_observations (goal_id, position)",
    """CREATE TABLE IF NOT EXISTS provider_fallbacks (
        goal_id TEXT PRIMARY KEY, fallback_models TEXT NOT NULL, current_model TEXT, status TEXT,
        prepared_model TEXT, attempted TEXT NOT NULL, reused INTEGER NOT NULL, observations INTEGER NOT NULL,
        last_kind TEXT, last_model TEXT, last_status_code INTEGER, last_observed_at TEXT, retry_at TEXT,
        updated_at TEXT NOT NULL, position INTEGER NOT NULL
    ) WITHOUT ROWID""",
)
_TABLES: Final = ("provider_limit_observations", "provider_fallbacks")
_FALLBACK_STATUS: Final[
    dict[type[i.FallbackExhausted | i.FallbackUnsupported | i.FallbackUnavailable], str]
] = {
    i.FallbackExhausted: "exhausted",
    i.FallbackUnsupported: "unsupported",
    i.FallbackUnavailable: "unavailable",
}
_TYPES: Final = frozenset(
    c.event_type
    for c in (
        g.GoalCreated,
        i.IdentitySwitchApplied,
        i.ProviderLimitObserved,
        i.FallbackPrepared,
        *_FALLBACK_STATUS,
    )
)


class ProviderLimits:
    """Rows of ``provider_limit_observations`` and ``provider_fallbacks`` (see the module docstring)."""

    name = "provider_limits"
    version = 1

    def schema(self, conn: sqlite3.Connection) -> None:
        for ddl in _DDL:
            conn.execute(ddl)

    def apply_batch(self, conn: sqlite3.Connection, envelopes: Sequence[Envelope]) -> None:
        for env in envelopes:
            self.apply(conn, env)

    def apply(self, conn: sqlite3.Connection, envelope: Envelope) -> None:
        if envelope.type not in _TYPES or not envelope.stream.startswith(GOAL_PREFIX):
            return
        e = decode_payload(envelope)
        goal_id: str = getattr(e, "goal_id", "")
        if isinstance(e, g.GoalCreated):
            _touch(conn, envelope, goal_id, fallback_models=e.config.fallback_models, model=e.config.model)
            return
        _touch(conn, envelope, goal_id)
        if isinstance(e, i.IdentitySwitchApplied):
            if e.to_model is not None:
                _set(conn, goal_id, current_model=e.to_model)
        elif isinstance(e, i.ProviderLimitObserved):
            conn.execute(
                "INSERT INTO provider_limit_observations (position, goal_id, kind, source, model, status_code, "
                "retry_at, observed_at, marks_blocker, correlation_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (envelope.position, goal_id, e.kind, e.source, e.model, e.status_code, e.retry_at, e.observed_at,
                 int(e.marks_blocker), envelope.correlation_id),
            )  # fmt: skip
            conn.execute(
                "UPDATE provider_fallbacks SET observations = observations + 1 WHERE goal_id = ?", (goal_id,)
            )
            _set(conn, goal_id, last_kind=e.kind, last_model=e.model, last_status_code=e.status_code,
                 last_observed_at=e.observed_at, retry_at=e.retry_at)  # fmt: skip
        elif isinstance(e, i.FallbackPrepared):
            _set(conn, goal_id, status="prepared", prepared_model=e.model, attempted=json_list(e.attempted),
                 reused=int(e.reused))  # fmt: skip
        elif isinstance(e, i.FallbackExhausted | i.FallbackUnsupported | i.FallbackUnavailable):
            _set(conn, goal_id, status=_FALLBACK_STATUS[type(e)], prepared_model=None,
                 attempted=json_list(e.attempted), reused=0)  # fmt: skip

    def reset(self, conn: sqlite3.Connection) -> None:
        for table in _TABLES:
            conn.execute(f"DROP TABLE IF EXISTS {table}")


def _touch(
    conn: sqlite3.Connection, env: Envelope, goal_id: str, *, fallback_models: Sequence[str] = (),
    model: str | None = None,
) -> None:  # fmt: skip
    """Create the goal's row if needed and move its ``updated_at``/``position`` to this event."""
    conn.execute(
        "INSERT INTO provider_fallbacks (goal_id, fallback_models, current_model, attempted, reused, "
        "observations, updated_at, position) VALUES (?, ?, ?, '[]', 0, 0, ?, ?) "
        "ON CONFLICT (goal_id) DO UPDATE SET updated_at = excluded.updated_at, position = excluded.position",
        (goal_id, json_list(fallback_models), model, env.recorded_at, env.position),
    )


def _set(conn: sqlite3.Connection, goal_id: str, **columns: Any) -> None:
    names = ", ".join(f"{name} = ?" for name in columns)
    conn.execute(f"UPDATE provider_fallbacks SET {names} WHERE goal_id = ?", (*columns.values(), goal_id))
