"""How :func:`~loopd_es.domain.evolve.evolve` folds ``goal.runtime_imported``: loopd's runtime record, as an
import read it, sets the counters and bookkeeping the ledger does not record. Apart from the fold's own rules
so each module stays small; registered when :mod:`~loopd_es.domain.evolve` is imported."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ..clock import parse_or_none
from ..events import imported as im
from .evolve_base import _Memo, _on

if TYPE_CHECKING:
    from .state import GoalDraft


@_on(im.GoalRuntimeImported)
def _runtime_imported(d: GoalDraft, e: im.GoalRuntimeImported, m: _Memo) -> None:
    """An import sets the counters to what loopd's snapshot says (the ledger does not record every turn)."""
    d.run_count = e.run_count
    d.budget_turn_count = e.budget_turn_count
    d.run_generation = max(d.run_generation, e.run_generation)
    d.no_progress_count = e.no_progress_count
    d.free_retry_pending = e.free_retry_pending
    if e.schedule_run_count is not None:
        d.schedule_run_count = e.schedule_run_count
    if e.next_run_at is not None:
        d.next_run_at = parse_or_none(e.next_run_at)
    d.turn_started_at = parse_or_none(e.turn_started_at)
    d.last_run_at = parse_or_none(e.last_run_at) or d.last_run_at
    d.last_worker_status = e.last_worker_status
    d.active_tool_call_ids = e.active_tool_call_ids
    d.last_compact_at = parse_or_none(e.last_compact_at)
    d.last_schedule_at = parse_or_none(e.last_schedule_at)
    d.last_parent_notified_at = parse_or_none(e.last_parent_notified_at)
    d.last_parent_notified_for = e.last_parent_notified_for
    d.verification_attempts = e.verification_attempts
    for name in _SNAPSHOT_WINS:  # absent (None) in imports written before these were carried over
        value = getattr(e, name)
        if value is not None:
            setattr(d, name, parse_or_none(value) if name in _TIMES else value)


_SNAPSHOT_WINS: Final = (
    "last_error",
    "progress_during_turn",
    "turn_tokens_used",
    "force_finish_requested",
    "stuck_notified_run_id",
    "worker_aborted_at",
)
"""Fields of ``goal.runtime_imported`` whose snapshot value replaces the folded one when it has one."""

_TIMES: Final = frozenset({"worker_aborted_at"})
"""Those of :data:`_SNAPSHOT_WINS` that are loopd's time text, read as instants here (the import's edge)."""
