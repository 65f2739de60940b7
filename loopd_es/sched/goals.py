"""Goal schedules (docs/reference/loopd.md#s3-15) fired through the same slots and fire records as ``/loop`` tasks.

A completed goal with ``schedule.every_ms >= 1000`` and runs left is due at ``next_run_at``. Its tick ``n``
(the run number it starts) is taken as slot ``n`` on ``loop-goal-<id>``: the scheduler takes the goal's fire
record (:mod:`.fires`), appends ``loop.slot_claimed`` at the slot stream's expected version, then resumes the goal
(``goal.resumed by=schedule`` plus the reference's tick message in its inbox) at the goal stream's expected
version - every write fenced on the record - so a tick that raced a user's change, or another engine, does
nothing. A tick whose scheduler died before its outcome is recorded as lost once its record runs out, and the
slot is taken again (attempt + 1). A writer goal waits while another writer goal is active (the reference's
``schedule.skipped-writer-active``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from ..domain.decide import decide
from ..domain.evolve import evolve as goal_evolve
from ..domain.evolve import initial
from ..domain.goal_commands import Facts, RunOnSchedule
from ..domain.loop.due import DueIndex
from ..domain.streams import GOAL_PREFIX, goal_stream
from ..errors import WrongExpectedVersionError
from ..events import loop as ev
from ..events.catalogue import decode_payload, new_event
from ..log.coord import Claim as Record
from ..log.coord import FenceLostError
from . import fires

if TYPE_CHECKING:
    from ..domain.state import GoalState
    from ..events.base import Event
    from ..events.envelope import Envelope
    from ..log.base import LogStore

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Slots:
    version: int = 0
    last_slot: int = 0
    """The last slot taken and not failed (a failed slot may be taken again)."""
    started: tuple[int, int] | None = None
    """``(slot, attempt)`` of a tick started and not ended."""
    failed: tuple[int, int] = (0, 0)
    """``(slot, attempt)`` of the last failed tick: taking that slot again is its next attempt."""


def goal_due(state: GoalState) -> datetime | None:
    """When the goal's next tick is due, ``None`` when it has no tick coming (conditions of
    docs/reference/loopd.md#s3-15)."""
    sched = state.config.schedule if state.exists else None
    if sched is None or sched.every_ms < 1000 or state.status != "complete":
        return None
    if sched.max_runs is not None and state.schedule_run_count >= sched.max_runs:
        return None
    return _next_run(state)


def _next_run(state: GoalState) -> datetime | None:
    return state.next_run_at


class GoalSlots:
    """Goal states folded from the log and the slot streams, with a due-time index of scheduled goals."""

    def __init__(self) -> None:
        self.goals: dict[str, GoalState] = {}
        self.slots: dict[str, _Slots] = {}
        self.records: dict[str, Record] = {}
        """Each goal's fire record as the scheduler last read it (goal id -> record)."""
        self.index = DueIndex()

    def apply(self, env: Envelope) -> None:
        if env.stream.startswith(GOAL_PREFIX):
            gid = env.stream[len(GOAL_PREFIX) :]
            state = self.goals.get(gid) or initial(gid)
            self.goals[gid] = new = goal_evolve(state, env)
            self.index.push(goal_due(new), gid, gid)
        elif env.stream.startswith(ev.GOAL_PREFIX):
            gid = env.stream[len(ev.GOAL_PREFIX) :]
            st = self.slots.setdefault(gid, _Slots())
            st.version = env.version
            e = decode_payload(env)
            if isinstance(e, ev.SlotClaimed):
                st.last_slot, st.started = e.slot, (e.slot, e.attempt)
            elif isinstance(e, ev.FireSucceeded | ev.FireFailed):
                st.started = None
                if isinstance(e, ev.FireFailed):
                    st.last_slot, st.failed = e.slot - 1, (e.slot, e.attempt)  # the slot may be taken again
            if gid in self.goals:
                self.index.push(goal_due(self.goals[gid]), gid, gid)

    def _writer_active(self, gid: str) -> bool:
        return any(
            o != gid and s.exists and s.is_writer and s.status == "active" for o, s in self.goals.items()
        )

    async def fire_due(
        self, store: LogStore, now: datetime, *, by: str, ttl_ms: int, retry_at: datetime
    ) -> int:
        """Tick every due goal; returns how many were resumed. One that must wait is looked at from ``retry_at``."""
        fired = 0
        for due, gid, _ in self.index.pop_due(now, lambda _s, k: goal_due(self.goals[k])):
            state = self.goals[gid]
            slots = self.slots.get(gid, _Slots())
            slot = state.schedule_run_count + 1
            record = self.records.get(gid)
            writer_waits = state.is_writer and self._writer_active(gid)
            done = slots.last_slot >= slot and slots.started is None
            if writer_waits or fires.busy(record, now) or done:
                if writer_waits:
                    log.info("schedule.skipped-writer-active goal=%s", gid)
                self.index.defer(due, gid, gid, retry_at)  # still due: look again soon
                continue
            attempt = _attempt(slots, slot)
            taken = await fires.take(store, fires.goal_key(gid), record, holder=by, now=now, ttl_ms=ttl_ms,
                                     names=(_task(gid), slot, attempt))  # fmt: skip
            if not isinstance(taken, fires.Hold):
                self.records[gid] = taken
                self.index.defer(due, gid, gid, retry_at)
                continue
            try:
                fired += await self._tick(store, state, slots, (slot, attempt), now, by, taken)
            except (WrongExpectedVersionError, FenceLostError):
                self.index.defer(due, gid, gid, retry_at)  # another engine moved first: look again
            finally:
                if await fires.release(store, taken):
                    self.records[gid] = Record(key=taken.key, holder="", token=taken.token, expires_us=0)
        return fired

    async def _tick(
        self,
        store: LogStore,
        state: GoalState,
        slots: _Slots,
        taking: tuple[int, int],
        now: datetime,
        by: str,
        hold: fires.Hold,
    ) -> int:
        gid = state.goal_id
        slot, attempt = taking
        key = _task(gid)
        fence = [hold.fence]
        stream = ev.goal_slot_stream(gid)
        version = slots.version
        if slots.started is not None:  # its scheduler stopped before the outcome; its record ran out
            lost_slot, lost_attempt = slots.started
            lost = ev.FireFailed(
                task_id=key, slot=lost_slot, attempt=lost_attempt, at=now, reason="claimer-lost"
            )
            [recorded] = await store.append(stream, [new_event(lost)], expected_version=version, fences=fence)
            version = recorded.version
        due = _next_run(state) or now
        claim = ev.SlotClaimed(
            task_id=key, slot=slot, attempt=attempt, due_at=due, claimed_at=now, by=by, goal_id=gid
        )
        [claimed] = await store.append(stream, [new_event(claim)], expected_version=version, fences=fence)
        resume = decide(RunOnSchedule(goal_id=gid, slot=slot, at=now), state, Facts(now=now))
        outcome: Event = ev.FireFailed(task_id=key, slot=slot, attempt=attempt, at=now, reason="goal changed")
        if resume:  # the goal's rules decide the tick; nothing decided: the goal moved on since it was due
            try:
                await store.append(
                    goal_stream(gid),
                    [new_event(e, causation_id=claimed.event_id) for e in resume],
                    expected_version=state.version,
                    fences=fence,
                )
                outcome = ev.FireSucceeded(task_id=key, slot=slot, attempt=attempt, at=now)
            except WrongExpectedVersionError:
                pass
        await store.append(stream, [new_event(outcome, causation_id=claimed.event_id)], fences=fence)
        return 1 if isinstance(outcome, ev.FireSucceeded) else 0


def _attempt(slots: _Slots, slot: int) -> int:
    """The attempt that taking ``slot`` now is (a failed or lost tick of the same slot counts)."""
    if slots.started is not None and slots.started[0] == slot:
        return slots.started[1] + 1
    return slots.failed[1] + 1 if slots.failed[0] == slot else 1


def _task(goal_id: str) -> str:
    """The task id of a goal schedule's slots."""
    return f"goal:{goal_id}"
