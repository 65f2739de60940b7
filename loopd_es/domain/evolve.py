"""``evolve(state, event) -> state``: the pure, total fold of a goal stream.

Events are facts, so evolve applies them as recorded; the rules live in the deciders. The only events
evolve refuses are those that *cannot* apply: anything before ``goal.created`` or after ``goal.cleared``, a
second ``goal.created``, a run event of another generation (the stale-event fence of
docs/reference/loopd.md#s2-3), an
event of another goal, or a payload that does not decode. Those are recorded as anomalies on the state and
folding goes on: evolve never raises.

Speed (``tools/bench_replay.py``): a fold copies the state twice in all, not once per event. A
:class:`GoalFold` thaws the frozen :class:`~loopd_es.domain.state.GoalState` into its mutable
:class:`~loopd_es.domain.state.GoalDraft`, each handler stores only the fields its event changes, and
:meth:`GoalFold.result` freezes the draft. Stored envelopes are routed by type string to a cached typed
decoder and handler, and the stream version and position are written once per batch, not per event.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NoReturn

import msgspec
from msgspec.structs import astuple

from ..errors import InvalidEventError
from ..events import goal as g
from ..events import run as r
from ..events.catalogue import decode_data
from ..events.envelope import Envelope, Foldable, Payload, Recorded
from .evolve_base import _HANDLERS, _ROUTES, _Handler, _Memo, _on, _Refused, lazy_route
from .evolve_who import noting_caller
from .state import (
    MAX_ACCOUNTED_IDS,
    MAX_ANOMALIES,
    Anomaly,
    Blocker,
    Evidence,
    GoalDraft,
    GoalState,
    InboxItem,
    Progress,
    TurnRequest,
)

if TYPE_CHECKING:
    from ..events.base import Event


def initial(goal_id: str) -> GoalState:
    """The state of a goal stream before its first event."""
    return GoalState(goal_id=goal_id)


def evolve(state: GoalState, item: Event | Foldable) -> GoalState:
    """Fold one event (or a stored envelope, which also sets the version and position); never raises."""
    folding = GoalFold(state)
    folding.apply((item,))
    return folding.result()


def fold(events: Iterable[Event | Foldable], state: GoalState) -> GoalState:
    """Fold events or envelopes left to right: the same result as :func:`evolve` on each in turn."""
    folding = GoalFold(state)
    folding.apply(events)
    return folding.result()


class GoalFold:
    """A goal fold in progress; a replay keeps one per stream and feeds it a batch at a time.

    The draft it mutates is its own copy, so the states it was given and has returned never change.
    """

    __slots__ = ("_draft", "_memo")

    def __init__(self, state: GoalState) -> None:
        self._draft = GoalDraft(*astuple(state))
        self._memo = _Memo()

    def apply(self, items: Iterable[Event | Foldable]) -> None:
        """Fold ``items`` in order; an envelope also moves the version and position. Never raises."""
        d, memo, routes, handlers = self._draft, self._memo, _ROUTES, _HANDLERS
        envelope, recorded, created = Envelope, Recorded, _created  # locals: this loop runs once per event
        creators = _evolve_fork.WITHOUT_GOAL
        last: Foldable | None = None  # the last recorded event: its version and position become the draft's
        event: Any
        for item in items:
            try:
                if type(item) is recorded or type(item) is envelope:
                    last = item
                    route = routes.get(item.type)
                    if route is not None and item.schema_version == route[0]:
                        handler: _Handler | None = route[2]
                        try:
                            event = route[1](item.data)
                        except msgspec.DecodeError:  # let the catalogue word the message
                            event = _decode(item.type, item.schema_version, item.data)
                    else:  # an older schema version to upcast, or not a goal event
                        event = _decode(item.type, item.schema_version, item.data)
                        handler = handlers.get(type(event))
                else:
                    event = item
                    handler = handlers.get(type(event))
                if (
                    handler is None
                    or event.goal_id != d.goal_id
                    or (not d.exists and handler is not created and handler not in creators)
                ):
                    _refuse(d, event, handler)
                handler(d, event, memo)
            except _Refused as refused:
                _note(d, refused, d.version if last is None else last.version)
        if last is not None:
            d.version, d.position = last.version, last.position

    def apply_rows(self, first_version: int, rows: Iterable[Payload], last_position: int) -> None:
        """Fold stored events given as a :class:`~loopd_es.events.envelope.StreamRows` batch gives them:
        ``rows[k]`` is version ``first_version + k``, and the last lies at ``last_position``. Never raises.

        :meth:`apply`'s loop over tuples instead of envelopes, for a replay of one stream (no struct a row).
        Its guard is a copy of :meth:`apply`'s, not a shared call: a call an event cost a 10k-event fold
        0.4 ms of 10 (by hand, median of 41, alternating).
        """
        d, memo, routes, handlers = self._draft, self._memo, _ROUTES, _HANDLERS
        created, creators = _created, _evolve_fork.WITHOUT_GOAL
        version = first_version - 1
        event: Any
        for type_, schema_version, data in rows:
            version += 1
            try:
                route = routes.get(type_)
                if route is not None and schema_version == route[0]:
                    handler: _Handler | None = route[2]
                    try:
                        event = route[1](data)
                    except msgspec.DecodeError:
                        event = _decode(type_, schema_version, data)
                else:
                    event = _decode(type_, schema_version, data)
                    handler = handlers.get(type(event))
                if (
                    handler is None
                    or event.goal_id != d.goal_id
                    or (not d.exists and handler is not created and handler not in creators)
                ):
                    _refuse(d, event, handler)
                handler(d, event, memo)
            except _Refused as refused:
                _note(d, refused, version)
        if version >= first_version:
            d.version, d.position = version, last_position

    def moved_to(self, version: int, position: int) -> None:
        """Set the draft's version and position: where the stream stands after rows applied with a position
        not yet known (a whole-log replay learns each stream's last place at the end)."""
        self._draft.version, self._draft.position = version, position

    def peek(self) -> tuple[str | None, int]:
        """The draft's active run id and anomaly count now, without the copy :meth:`result` makes.

        For readers that need each event's effect on the run (``projections.runs``): two attribute reads
        between events instead of a sixty-field copy per event. Pure: changes nothing.
        """
        d = self._draft
        return d.active_run_id, d.anomaly_count

    def result(self) -> GoalState:
        """The state after everything applied so far (folding may go on afterwards)."""
        self._memo.write_back(self._draft)
        return GoalState(*astuple(self._draft))


def _decode(type_: str, schema_version: int, data: bytes | msgspec.Raw) -> Any:
    """The slow path: the catalogue's full decode with upcasting; a payload it cannot read is refused."""
    try:
        return decode_data(type_, bytes(data), schema_version)
    except InvalidEventError as e:
        raise _Refused(type_, str(e)) from None


def _refuse(d: GoalDraft, event: Any, handler: _Handler | None) -> NoReturn:
    """Say why ``event`` cannot apply to the draft (the folds test the three cases in one condition)."""
    if handler is None:
        raise _Refused(event.event_type, "not a goal event")
    if event.goal_id != d.goal_id:
        raise _Refused(event.event_type, f"event of goal {event.goal_id!r} on the stream of {d.goal_id!r}")
    raise _Refused(event.event_type, "goal was cleared" if d.cleared else "goal does not exist")


def _note(d: GoalDraft, refused: _Refused, version: int) -> None:
    """Record an event that could not apply as an anomaly of the state (the last few kept, all counted)."""
    anomaly = Anomaly(type=refused.type_, reason=refused.reason, version=version)
    d.anomalies = (*d.anomalies, anomaly)[-MAX_ANOMALIES:]
    d.anomaly_count += 1


def _release(d: GoalDraft) -> None:
    """The reference's ``releaseLease`` plus clearing the run (every caller here clears ``activeRunID``)."""
    d.phase = "idle"
    d.run_deadline = None
    d.active_run_id = None
    d.active_prompt_message_id = None
    d.idle_candidate_generation = None


def _stale(d: GoalDraft, event: r.RunIdleCandidate | r.RunCompleted | r.RunRecovered | r.RunStuck) -> bool:
    generation = event.generation
    if generation is not None and generation != d.run_generation:
        return True
    return d.active_run_id is not None and event.run_id != d.active_run_id


# -- goal lifecycle ---------------------------------------------------------------------------------


@_on(g.GoalCreated)
def _created(d: GoalDraft, e: g.GoalCreated, m: _Memo) -> None:
    if d.exists:
        raise _Refused(e.event_type, "goal already exists")
    if d.cleared:  # a stream is one goal's life: a cleared goal never comes back with its old counters
        raise _Refused(e.event_type, "goal was cleared")
    d.exists = True
    d.name = e.name
    d.objective = e.objective
    d.owner_session_id = e.owner_session_id
    d.config = e.config
    d.interactive = e.config.interactive
    d.parent_model = e.parent_model
    d.parent_agent = e.parent_agent
    d.status = "active"
    d.phase = "queued"
    d.created_at = e.at
    d.created_by = e.called_by


@_on(g.GoalWorkerAssigned)
def _worker(d: GoalDraft, e: g.GoalWorkerAssigned, m: _Memo) -> None:
    d.worker_session_id = e.worker_session_id
    d.topology = e.topology
    d.native_parent_id = e.native_parent_id


@_on(g.GoalStatusChanged)
def _status(d: GoalDraft, e: g.GoalStatusChanged, m: _Memo) -> None:
    if e.to_status in ("budget_limited", "paused"):
        _release(d)
    d.status = e.to_status


@_on(g.GoalPaused)
def _paused(d: GoalDraft, e: g.GoalPaused, m: _Memo) -> None:
    _release(d)
    d.status = "paused"


@_on(g.GoalResumed)
def _resumed(d: GoalDraft, e: g.GoalResumed, m: _Memo) -> None:
    d.status = "active"
    if e.by == "switch":
        d.blocker = None


@_on(g.GoalRetried)
def _retried(d: GoalDraft, e: g.GoalRetried, m: _Memo) -> None:
    _release(d)
    d.status = "active"
    d.consecutive_failures = 0
    d.last_error = None
    d.force_finish_requested = None
    d.evaluator_rejection_count = 0
    d.last_rejection_details = None
    d.free_retry_pending = False


@_on(g.GoalCleared)
def _cleared(d: GoalDraft, e: g.GoalCleared, m: _Memo) -> None:
    _release(d)
    d.exists = False
    d.cleared = True
    d.inbox = ()


@_on(g.GoalProgressReported)
def _progress(d: GoalDraft, e: g.GoalProgressReported, m: _Memo) -> None:
    d.progress_during_turn = True
    d.no_progress_count = 0
    d.consecutive_failures = 0
    d.last_progress = Progress(summary=e.summary, next=e.next, at=e.at)


@_on(g.GoalCompletionRejected)
def _rejected(d: GoalDraft, e: g.GoalCompletionRejected, m: _Memo) -> None:
    d.evaluator_rejection_count = e.rejection_count
    d.last_rejection_details = e.details or None
    if e.free_retry:
        d.force_finish_requested = False
        d.free_retry_pending = True
    else:
        _release(d)
        d.free_retry_pending = False
        d.force_finish_requested = None


@_on(g.GoalCompleted)
def _completed(d: GoalDraft, e: g.GoalCompleted, m: _Memo) -> None:
    _release(d)
    d.status = "complete"
    d.completion_evidence = Evidence(summary=e.summary, evidence=e.evidence, at=e.at)
    d.last_error = None
    if d.config.schedule is not None and not e.forced:
        d.schedule_run_count += 1
        d.next_run_at = e.next_run_at


@_on(g.GoalBlocked)
def _blocked(d: GoalDraft, e: g.GoalBlocked, m: _Memo) -> None:
    _release(d)
    d.status = "blocked"
    d.blocker = Blocker(reason=e.reason, needed=e.needed, kind=e.kind, at=e.at)
    d.force_finish_requested = None
    d.retry_after = None
    if e.last_error is not None:
        d.last_error = e.last_error


@_on(g.GoalWorkerAborted)
def _aborted(d: GoalDraft, e: g.GoalWorkerAborted, m: _Memo) -> None:
    _release(d)
    d.worker_aborted_at = e.at


@_on(g.GoalInteractiveChanged)
def _interactive(d: GoalDraft, e: g.GoalInteractiveChanged, m: _Memo) -> None:
    d.interactive = e.interactive


@_on(g.GoalUsageAccounted)
def _usage(d: GoalDraft, e: g.GoalUsageAccounted, m: _Memo) -> None:
    ids = e.message_ids
    if len(ids) == 1 and (m.dirty or d.accounted_message_ids is m.ids):
        # a replay's usual case, inlined: one id against the memo's live watermark (as _Memo.account does)
        mid, counts, order = ids[0], m.counts, m.order
        if mid in counts:
            raise _Refused(e.event_type, "every message id was already accounted")
        order.append(mid)
        counts[mid] = 1
        if len(order) > MAX_ACCOUNTED_IDS:
            old = order.popleft()
            if counts[old] == 1:
                del counts[old]
            else:
                counts[old] -= 1
        m.dirty = True
    else:
        seen = m.seen(d)
        fresh: tuple[str, ...]
        if len(ids) == 1:  # without the de-duplication below
            fresh = ids if ids[0] not in seen else ()
        else:
            fresh = tuple(mid for mid in dict.fromkeys(ids) if mid not in seen)
        if not fresh:
            raise _Refused(e.event_type, "every message id was already accounted")
        if len(fresh) != len(ids):
            raise _Refused(e.event_type, "some message ids were already accounted; deltas not applied")
        m.account(d, fresh)
    d.tokens_used += e.token_delta
    d.cost_used += e.cost_delta
    d.time_used_seconds += e.time_delta_seconds
    d.turn_tokens_used += e.token_delta


@_on(g.GoalInputQueued)
def _queued(d: GoalDraft, e: g.GoalInputQueued, m: _Memo) -> None:
    if any(item.input_id == e.input_id for item in d.inbox):
        raise _Refused(e.event_type, f"input {e.input_id} is already queued")
    d.inbox = (*d.inbox, InboxItem(input_id=e.input_id, text=e.text, sender=e.sender, at=e.at))


@_on(g.GoalInputDelivered)
def _delivered(d: GoalDraft, e: g.GoalInputDelivered, m: _Memo) -> None:
    ids = set(e.input_ids)
    d.inbox = tuple(item for item in d.inbox if item.input_id not in ids)


@_on(g.GoalNudged)
def _nudged(d: GoalDraft, e: g.GoalNudged, m: _Memo) -> None:
    d.phase = "idle"
    d.active_run_id = None
    d.idle_candidate_generation = None
    d.active_prompt_message_id = None


@_on(g.GoalTurnRequested)
def _turn_requested(d: GoalDraft, e: g.GoalTurnRequested, m: _Memo) -> None:
    d.turn_requested = TurnRequest(kind=e.kind, force=e.force, switch_id=e.switch_id, at=e.at)


@_on(g.GoalForceFinishRequested)
def _force_finish(d: GoalDraft, e: g.GoalForceFinishRequested, m: _Memo) -> None:
    d.force_finish_requested = True


@_on(g.GoalBudgetExhausted)
def _budget(d: GoalDraft, e: g.GoalBudgetExhausted, m: _Memo) -> None:
    _release(d)
    d.status = "budget_limited"


# -- runs ---------------------------------------------------------------------------------------------


@_on(r.RunStarted)
def _run_started(d: GoalDraft, e: r.RunStarted, m: _Memo) -> None:
    if e.generation <= d.run_generation:
        raise _Refused(e.event_type, f"generation {e.generation} is not after {d.run_generation}")
    d.phase = "running"
    d.turn_requested = None  # whoever started it, the requested turn is this one
    d.active_run_id = e.run_id
    d.active_prompt_message_id = e.prompt_message_id
    d.run_generation = e.generation
    d.run_deadline = e.deadline
    d.run_count = e.turn_count
    if e.charged:
        d.budget_turn_count += 1
    else:
        d.free_retry_pending = False
    d.progress_during_turn = False
    d.turn_tokens_used = 0
    d.idle_candidate_generation = None
    d.retry_after = None
    d.turn_started_at = started = e.at
    d.last_run_at = started or d.last_run_at
    d.active_tool_call_ids = ()


@_on(r.RunIdleCandidate)
def _idle_candidate(d: GoalDraft, e: r.RunIdleCandidate, m: _Memo) -> None:
    if _stale(d, e):
        raise _Refused(e.event_type, "stale run")
    d.idle_candidate_generation = e.generation


@_on(r.RunCompleted)
def _run_completed(d: GoalDraft, e: r.RunCompleted, m: _Memo) -> None:
    if d.active_run_id != e.run_id or _stale(d, e):
        raise _Refused(e.event_type, "stale run")
    if d.config.max_no_progress and not d.progress_during_turn:
        # The reference never counts (its maxNoProgress guard is dead); a goal that asked for the guard gets it,
        # and one that did not folds exactly as before.
        d.no_progress_count += 1
    _release(d)
    d.confirm_failed_generation = None


@_on(r.RunFailed)
def _run_failed(d: GoalDraft, e: r.RunFailed, m: _Memo) -> None:
    if (e.generation is not None and e.generation != d.run_generation) or (
        d.active_run_id is not None and e.run_id not in (d.active_run_id, "unknown")
    ):
        raise _Refused(e.event_type, "stale run")
    _release(d)
    d.consecutive_failures = e.consecutive_failures
    d.last_error = e.error
    if e.retry_after is not None:
        d.phase = "waiting_retry"
        d.retry_after = e.retry_after


@_on(r.RunFellBack)
def _run_fell_back(d: GoalDraft, e: r.RunFellBack, m: _Memo) -> None:
    if (e.generation is not None and e.generation != d.run_generation) or d.active_run_id != e.run_id:
        raise _Refused(e.event_type, "stale run")
    _release(d)  # failures, last error and backoff untouched: the next turn, on the fallback, is due now
    d.phase = "waiting_retry"
    d.retry_after = e.at


@_on(r.RunRecovered)
def _run_recovered(d: GoalDraft, e: r.RunRecovered, m: _Memo) -> None:
    if _stale(d, e):
        raise _Refused(e.event_type, "stale run")
    _release(d)
    d.confirm_failed_generation = None


@_on(r.RunStuck)
def _run_stuck(d: GoalDraft, e: r.RunStuck, m: _Memo) -> None:
    if _stale(d, e):
        raise _Refused(e.event_type, "stale run")
    d.stuck_notified_run_id = e.run_id


@_on(r.RunConfirmFailed)
def _confirm_failed(d: GoalDraft, e: r.RunConfirmFailed, m: _Memo) -> None:
    if e.generation != d.run_generation:
        raise _Refused(e.event_type, "stale run")
    d.confirm_failed_generation = e.generation


from . import evolve_compaction as _evolve_compaction  # noqa: E402, F401  (registers its handlers first)
from . import evolve_fork as _evolve_fork  # noqa: E402  (registers its handlers first)
from . import evolve_identity as _evolve_identity  # noqa: E402, F401  (registers its handlers first)
from . import evolve_imported as _evolve_imported  # noqa: E402, F401  (registers its handlers first)

# only the types that record a caller pay for it; the creators stay themselves (``apply`` knows them by identity)
for _cls, _fn in list(_HANDLERS.items()):
    if "called_by" in _cls.__struct_fields__ and _fn is not _created and _fn not in _evolve_fork.WITHOUT_GOAL:
        _HANDLERS[_cls] = noting_caller(_cls, _fn)


_ROUTES.update((cls.event_type, lazy_route(cls, fn)) for cls, fn in _HANDLERS.items())
