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

from loopd_es.clock import stamp_or_none
from loopd_es.domain.streams import GOAL_PREFIX
from loopd_es.events import goal as g
from loopd_es.events import identity as i

from ._base import BatchModel
from ._fold import json_list, payload, when

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


_FALLBACK_COLUMNS: Final = (
    "goal_id", "fallback_models", "current_model", "status", "prepared_model", "attempted", "reused", "observations",
    "last_kind", "last_model", "last_status_code", "last_observed_at", "retry_at", "updated_at", "position",
)  # fmt: skip
_COL: Final = {name: k for k, name in enumerate(_FALLBACK_COLUMNS)}
_SELECT: Final = f"SELECT {', '.join(_FALLBACK_COLUMNS)} FROM provider_fallbacks WHERE goal_id = ?"
_WRITE: Final = (
    f"INSERT OR REPLACE INTO provider_fallbacks ({', '.join(_FALLBACK_COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(_FALLBACK_COLUMNS))})"
)
_OBSERVE: Final = (
    "INSERT INTO provider_limit_observations (position, goal_id, kind, source, model, status_code, retry_at, "
    "observed_at, marks_blocker, correlation_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


class ProviderLimits(BatchModel):
    """Rows of ``provider_limit_observations`` and ``provider_fallbacks`` (see the module docstring)."""

    name = "provider_limits"
    version = 1
    rebuild_cost = 0.4  # CPU s per 1M events of tools/bench_rebuild.py, alone: balances a parallel rebuild
    DDL = _DDL
    TABLES = _TABLES

    def apply_batch(self, conn: sqlite3.Connection, envelopes: Sequence[Envelope]) -> None:
        """Each goal's fallback row read at most once and written once per batch; observations in one go."""
        fallbacks: dict[str, list[Any] | None] = {}
        observations: list[tuple[Any, ...]] = []
        for env in envelopes:
            if env.type not in _TYPES or not env.stream.startswith(GOAL_PREFIX):
                continue
            e = payload(env)
            goal_id: str = getattr(e, "goal_id", "")
            if goal_id not in fallbacks:
                found = conn.execute(_SELECT, (goal_id,)).fetchone()
                fallbacks[goal_id] = None if found is None else list(found)
            row = fallbacks[goal_id]
            if row is None:  # _touch: the goal's row, created by its first event here
                models = e.config.fallback_models if isinstance(e, g.GoalCreated) else ()
                model = e.config.model if isinstance(e, g.GoalCreated) else None
                row = fallbacks[goal_id] = [goal_id, json_list(models), model, None, None, "[]", 0, 0, None, None,
                                            None, None, None, when("", env), env.position]  # fmt: skip
            else:
                row[_COL["updated_at"]], row[_COL["position"]] = when("", env), env.position
            if isinstance(e, i.IdentitySwitchApplied):
                if e.to_model is not None:
                    row[_COL["current_model"]] = e.to_model
            elif isinstance(e, i.ProviderLimitObserved):
                observations.append((env.position, goal_id, e.kind, e.source, e.model, e.status_code, stamp_or_none(e.retry_at),
                                     stamp_or_none(e.observed_at), int(e.marks_blocker), env.correlation_id))  # fmt: skip
                row[_COL["observations"]] += 1
                _set(row, last_kind=e.kind, last_model=e.model, last_status_code=e.status_code,
                     last_observed_at=stamp_or_none(e.observed_at), retry_at=stamp_or_none(e.retry_at))  # fmt: skip
            elif isinstance(e, i.FallbackPrepared):
                _set(row, status="prepared", prepared_model=e.model, attempted=json_list(e.attempted),
                     reused=int(e.reused))  # fmt: skip
            elif isinstance(e, i.FallbackExhausted | i.FallbackUnsupported | i.FallbackUnavailable):
                _set(row, status=_FALLBACK_STATUS[type(e)], prepared_model=None, attempted=json_list(e.attempted),
                     reused=0)  # fmt: skip
        conn.executemany(_OBSERVE, observations)
        conn.executemany(_WRITE, [row for row in fallbacks.values() if row is not None])


def _set(row: list[Any], **columns: Any) -> None:
    for name, value in columns.items():
        row[_COL[name]] = value
