"""The deciders of the records the engine makes about a goal's turns: workers, idles, watchdogs, compaction.

They hold the rules the engine used to apply before writing an event by hand (which run a record may name,
what is recorded once), so each rule lives here only. Every decider is pure and quiet: a command that no
longer applies (the run moved on, the goal went away) decides nothing, because the engine reacts to facts
that may be a moment old and an engine never fails on a stale one. :func:`loopd_es.domain.decide.decide`
dispatches to them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import msgspec

from ..clock import whole_ms
from ..events import engine as en
from ..events import goal as g
from ..events import run as r
from ..events.base import Event
from . import goal_commands as c
from .loop import texts
from .state import GoalState

_Decider = Callable[[Any, GoalState, c.Facts], list[Event]]
DECIDERS: Final[dict[type, _Decider]] = {}


def _on(cls: type) -> Callable[[_Decider], _Decider]:
    def register(fn: _Decider) -> _Decider:
        DECIDERS[cls] = fn
        return fn

    return register


def _on_run(state: GoalState, run_id: str, generation: int) -> bool:
    """Whether the goal is active and still running run ``run_id`` of ``generation``."""
    return (
        state.exists
        and state.status == "active"
        and state.phase == "running"
        and state.active_run_id == run_id
        and state.run_generation == generation
    )


def _record(kind: type[Event], cmd: c.GoalCommand, state: GoalState, **extra: Any) -> list[Event]:
    """One ``kind`` event of the goal carrying the command's fields that ``kind`` records, and ``extra``."""
    fields = {k: v for k, v in msgspec.structs.asdict(cmd).items() if k in kind.__struct_fields__}
    return [kind(**{**fields, **extra, "goal_id": state.goal_id})]


@_on(c.AssignWorker)
def _assign(cmd: c.AssignWorker, state: GoalState, facts: c.Facts) -> list[Event]:
    return _record(g.GoalWorkerAssigned, cmd, state) if state.exists else []


@_on(c.RequestTurn)
def _request_turn(cmd: c.RequestTurn, state: GoalState, facts: c.Facts) -> list[Event]:
    flight = state.switch_in_flight
    if not state.exists or flight is None or flight.switch_id != cmd.switch_id:
        return []  # the switch ended: the caller starts the turn itself
    waiting = state.turn_requested
    if waiting is not None and not (cmd.kind == "bare" and waiting.kind != "bare"):
        return []  # one request waits already (a bare one replaces a steering one: it carries the inbox)
    return [
        g.GoalTurnRequested(
            goal_id=state.goal_id,
            kind=cmd.kind,
            force=cmd.force,
            switch_id=cmd.switch_id,
            at=whole_ms(facts.now),
        )
    ]


@_on(c.RecordInputDelivered)
def _delivered(cmd: c.RecordInputDelivered, state: GoalState, facts: c.Facts) -> list[Event]:
    waiting = {i.input_id for i in state.inbox}
    ids = tuple(i for i in cmd.input_ids if i in waiting)
    if not state.exists or not ids:
        return []
    return [g.GoalInputDelivered(goal_id=state.goal_id, input_ids=ids, run_id=cmd.run_id)]


@_on(c.QueueEvidence)
def _evidence(cmd: c.QueueEvidence, state: GoalState, facts: c.Facts) -> list[Event]:
    if not state.exists:
        return []
    return [
        g.GoalInputQueued(
            goal_id=state.goal_id, input_id=cmd.input_id, text=cmd.text, sender="worker", at=cmd.at
        )
    ]


@_on(c.WakeForEvidence)
def _wake(cmd: c.WakeForEvidence, state: GoalState, facts: c.Facts) -> list[Event]:
    if state.status != "active" or state.worker_session_id is None:
        return []
    if not any(i.input_id == cmd.input_id for i in state.inbox):
        return []  # delivered already: the wake is done
    return [g.GoalNudged(goal_id=state.goal_id)]


@_on(c.StageIdleCandidate)
def _stage(cmd: c.StageIdleCandidate, state: GoalState, facts: c.Facts) -> list[Event]:
    if not _on_run(state, cmd.run_id, cmd.generation):
        return []
    return _record(r.RunIdleCandidate, cmd, state, at=whole_ms(facts.now))


@_on(c.RecordConfirmFailure)
def _confirm_failed(cmd: c.RecordConfirmFailure, state: GoalState, facts: c.Facts) -> list[Event]:
    if not _on_run(state, cmd.run_id, cmd.generation) or state.confirm_failed_generation == cmd.generation:
        return []
    return _record(r.RunConfirmFailed, cmd, state, at=whole_ms(facts.now))


@_on(c.RecoverRun)
def _recover(cmd: c.RecoverRun, state: GoalState, facts: c.Facts) -> list[Event]:
    return _record(r.RunRecovered, cmd, state) if _on_run(state, cmd.run_id, cmd.generation) else []


@_on(c.RecordStuck)
def _stuck(cmd: c.RecordStuck, state: GoalState, facts: c.Facts) -> list[Event]:
    if not _on_run(state, cmd.run_id, cmd.generation) or state.stuck_notified_run_id == cmd.run_id:
        return []
    return _record(r.RunStuck, cmd, state)


@_on(c.StartCompaction)
def _compaction_started(cmd: c.StartCompaction, state: GoalState, facts: c.Facts) -> list[Event]:
    if not state.exists:
        return []
    return [en.CompactionStarted(goal_id=state.goal_id, run_count=state.run_count, at=whole_ms(facts.now))]


@_on(c.CompleteCompaction)
def _compaction_completed(cmd: c.CompleteCompaction, state: GoalState, facts: c.Facts) -> list[Event]:
    return _record(en.CompactionCompleted, cmd, state) if state.exists else []


@_on(c.RunOnSchedule)
def _run_on_schedule(cmd: c.RunOnSchedule, state: GoalState, facts: c.Facts) -> list[Event]:
    """The tick resumes a completed goal with the reference's tick message in its inbox; a goal that is no
    longer completed, or has used its runs, is left alone (the tick raced a change)."""
    sched = state.config.schedule if state.exists else None
    if sched is None or state.status != "complete":
        return []
    if sched.max_runs is not None and state.schedule_run_count >= sched.max_runs:
        return []
    resumed = g.GoalResumed(goal_id=state.goal_id, from_status="complete", by="schedule")
    tick = f"schedule-tick-{cmd.slot}"
    if any(item.input_id == tick or item.input_id.startswith(tick + "-") for item in state.inbox):
        return [resumed]  # a tick of this run again (after a forced completion): its message still waits
    text = texts.goal_tick(state.schedule_run_count, sched.max_runs)
    input_id = tick if cmd.attempt == 1 else f"{tick}-{cmd.attempt}"
    return [resumed, g.GoalInputQueued(goal_id=state.goal_id, input_id=input_id, text=text, at=cmd.at)]
