"""Two goals side by side (``loopd-es compare A B``): how they are related (fork, source, siblings), and
each one's identity, budget, usage and outcome, with what each did after the point they share."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

import msgspec

from ..domain.evolve import fold, initial
from ..domain.streams import goal_stream
from ..errors import UsageError
from ..events.catalogue import decode_payload
from ..events.goal import GoalForkedFrom

if TYPE_CHECKING:
    from ..domain.state import GoalState
    from ..events.envelope import Envelope
    from ..log.base import LogStore


class Side(msgspec.Struct, frozen=True, kw_only=True):
    """One goal of the comparison: its state and the events it had after the shared point."""

    goal_id: str
    name: str
    events_after: int
    types_after: dict[str, int]


class Row(msgspec.Struct, frozen=True, kw_only=True):
    field: str
    a: Any
    b: Any
    same: bool


class Comparison(msgspec.Struct, frozen=True, kw_only=True):
    """``relation`` says how B relates to A: ``fork`` (B was forked from A), ``source`` (A from B),
    ``siblings`` (both from one goal at ``shared_at``) or ``unrelated``."""

    a: Side
    b: Side
    relation: str
    shared_at: int | None
    rows: tuple[Row, ...]


_ROWS: Final[tuple[tuple[str, Callable[[GoalState], Any]], ...]] = (
    ("status", lambda s: f"cleared (was {s.status})" if s.cleared else s.status),
    ("phase", lambda s: s.phase),
    ("objective", lambda s: s.objective),
    ("model", lambda s: s.config.model),
    ("agent", lambda s: s.config.agent),
    ("max_turns", lambda s: s.config.max_turns),
    ("cost_budget", lambda s: s.config.cost_budget),
    ("token_budget", lambda s: s.config.token_budget),
    ("turns (charged)", lambda s: s.budget_turn_count),
    ("turns (all)", lambda s: s.run_count),
    ("tokens", lambda s: s.tokens_used),
    ("cost", lambda s: round(s.cost_used, 6)),
    ("time (s)", lambda s: round(s.time_used_seconds, 3)),
    ("failures in a row", lambda s: s.consecutive_failures),
    ("rejections", lambda s: s.evaluator_rejection_count),
    ("last progress", lambda s: s.last_progress.summary if s.last_progress else None),
    ("completion", lambda s: s.completion_evidence.summary if s.completion_evidence else None),
    ("blocker", lambda s: s.blocker.reason if s.blocker else None),
    ("worker", lambda s: s.worker_session_id),
)


async def compare_goals(store: LogStore, a_id: str, b_id: str) -> Comparison:
    """Fold both goals and lay them side by side.

    :raises UsageError: when either goal has no stream.
    """
    a_events, b_events = await _events(store, a_id), await _events(store, b_id)
    a, b = fold(a_events, initial(a_id)), fold(b_events, initial(b_id))
    a_from, b_from = _origin(b_events), _origin(a_events)
    relation, a_cut, b_cut, shared = "unrelated", 0, 0, None
    if a_from is not None and a_from.source_goal_id == a_id:
        relation, a_cut, b_cut, shared = "fork", a_from.at_version, 1, a_from.at_position
    elif b_from is not None and b_from.source_goal_id == b_id:
        relation, a_cut, b_cut, shared = "source", 1, b_from.at_version, b_from.at_position
    elif a_from is not None and b_from is not None and a_from.source_goal_id == b_from.source_goal_id:
        relation, a_cut, b_cut = "siblings", 1, 1
        shared = min(a_from.at_position, b_from.at_position)
    rows = tuple(Row(field=name, a=get(a), b=get(b), same=get(a) == get(b)) for name, get in _ROWS)
    return Comparison(
        a=_side(a, a_events, a_cut),
        b=_side(b, b_events, b_cut),
        relation=relation,
        shared_at=shared,
        rows=rows,
    )


async def _events(store: LogStore, goal_id: str) -> list[Envelope]:
    stream = goal_stream(goal_id)
    if await store.stream_version(stream) == 0:
        raise UsageError(f"no goal {goal_id!r} in {store.url}; `loopd-es goals` lists the goal ids")
    return [env async for env in store.read_stream(stream)]


def _origin(events: list[Envelope]) -> GoalForkedFrom | None:
    """The fork record a goal's stream starts with, if it is a fork."""
    if events and events[0].type == GoalForkedFrom.event_type:
        found = decode_payload(events[0])
        return found if isinstance(found, GoalForkedFrom) else None
    return None


def _side(state: GoalState, events: list[Envelope], cut: int) -> Side:
    after = [e.type for e in events if e.version > cut]
    return Side(
        goal_id=state.goal_id,
        name=state.name,
        events_after=len(after),
        types_after=dict(sorted(Counter(after).items())),
    )
