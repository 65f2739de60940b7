"""Goal schedules (docs/reference/loopd.md#s3-15) fired through the same slots and fire records as ``/loop`` tasks.

A completed goal with ``schedule.every_ms >= 1000`` and runs left is due at ``next_run_at``. Its tick ``n``
(the run number it starts) is taken as slot ``n`` on ``loop-goal-<id>``: the scheduler takes the goal's fire
record (:mod:`.fires`), appends ``loop.slot_claimed`` at the slot stream's expected version, then resumes the goal
(``goal.resumed by=schedule`` plus the reference's tick message in its inbox) at the goal stream's expected
version - every write fenced on the record - so a tick that raced a user's change, or another engine, does
nothing. A tick whose scheduler died before its outcome is recorded as lost once its record runs out, and the
slot is taken again (attempt + 1). So is the slot of a run force-completed after its tick: a forced completion
counts no run and leaves ``next_run_at`` due, and the reference's next tick resumes such a goal again. A writer
goal waits while another writer goal is active (the reference's ``schedule.skipped-writer-active``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from ..clock import from_us
from ..domain.decide import decide
from ..domain.evolve import evolve as goal_evolve
from ..domain.evolve import initial
from ..domain.goal_commands import Facts, RunOnSchedule
from ..domain.loop.due import DueIndex
from ..domain.streams import GOAL_PREFIX, goal_stream
from ..errors import WrongExpectedVersionError
from ..events import loop as ev
from ..events.catalogue import decode_payload, new_event
from ..log.coord import FenceLostError
from . import fires

if TYPE_CHECKING:
    from ..clock import Clock
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
    claimed: tuple[int, int] = (0, 0)
    """``(slot, attempt)`` of the last tick taken: taking that slot again is its next attempt."""
    claimed_position: int = 0
    """The log position of that claim."""
    succeeded: int = 0
    """The slot of the last tick that resumed its goal."""


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

    def __init__(self, store: LogStore, *, holder: str, clock: Clock, ttl_ms: int) -> None:
        self.store, self.holder = store, holder
        self.goals: dict[str, GoalState] = {}
        self.slots: dict[str, _Slots] = {}
        self.fires = fires.Records(store, fires.GOAL_PREFIX, holder=holder, clock=clock, ttl_ms=ttl_ms)
        self.index = DueIndex()

    def apply(self, env: Envelope) -> None:
        if env.stream.startswith(GOAL_PREFIX):
            gid = env.stream[len(GOAL_PREFIX) :]
            state = self.goals.get(gid) or initial(gid)
            self.goals[gid] = new = goal_evolve(state, env)
            self.index.push(goal_due(new), gid, gid)
            self.index.undefer()  # a writer goal may have stopped: the goals waiting on it look again
        elif env.stream.startswith(ev.GOAL_PREFIX):
            gid = env.stream[len(ev.GOAL_PREFIX) :]
            st = self.slots.setdefault(gid, _Slots())
            st.version = env.version
            e = decode_payload(env)
            if isinstance(e, ev.SlotClaimed):
                st.last_slot, st.started = e.slot, (e.slot, e.attempt)
                st.claimed, st.claimed_position = (e.slot, e.attempt), env.position
            elif isinstance(e, ev.FireSucceeded):
                st.started, st.succeeded = None, e.slot
            elif isinstance(e, ev.FireFailed):
                st.started, st.last_slot = None, e.slot - 1  # the slot may be taken again
            if gid in self.goals:
                self.index.push(goal_due(self.goals[gid]), gid, gid)

    def next_at(self) -> datetime | None:
        """When a goal is next due (or next to be looked at again)."""
        return self.index.next_at(self._due_of)

    def _due_of(self, _scope: str, gid: str) -> datetime | None:
        return goal_due(self.goals[gid])

    def _writer_active(self, gid: str) -> bool:
        return any(
            o != gid and s.exists and s.is_writer and s.status == "active" for o, s in self.goals.items()
        )

    async def fire_due(self, now: datetime, *, retry: timedelta) -> int:
        """Tick every due goal; returns how many were resumed. One that must wait is looked at ``retry`` later."""
        fired = 0
        left = self.index.pop_due(now, self._due_of)
        try:  # whatever is left when this raises or is cancelled is indexed again (push is synchronous)
            while left:
                due, gid, _ = left[0]
                fired += await self._due(gid, due, now, retry)
                left.pop(0)
        finally:
            for due, gid, _ in left:  # after a pause: a failed tick (an outage) is not retried at once
                self.index.push(due, gid, gid, look_at=self.fires.clock.now() + retry)
        return fired

    async def _due(self, gid: str, due: datetime, now: datetime, retry: timedelta) -> int:
        retry_at = self.fires.clock.now() + retry
        state = self.goals[gid]
        slots = self.slots.get(gid, _Slots())
        slot = state.schedule_run_count + 1
        if slots.last_slot >= slot and slots.started is None and not _forced_since(state, slots, slot):
            return (
                0  # this run's tick was taken and the goal has not completed it: indexed again when it does
            )
        if state.is_writer and self._writer_active(gid):
            log.info("schedule.skipped-writer-active goal=%s", gid)
            self.index.defer(due, gid, gid, retry_at)
            return 0
        attempt = _attempt(slots, slot)
        hold = (
            await self.fires.take(gid, (_task(gid), slot, attempt))
            if await self.fires.free(gid, now)
            else None
        )
        if hold is None:  # another runner ticks it (or died doing so): look again when its record runs out
            record = self.fires.known.get(gid)
            until = from_us(record.expires_us) if record is not None and record.holder else retry_at
            self.index.defer(due, gid, gid, max(retry_at, until))
            return 0
        try:
            return await self._tick(state, slots, (slot, attempt), now, hold)
        except (WrongExpectedVersionError, FenceLostError):
            self.index.defer(due, gid, gid, retry_at)  # another engine moved first: look again
            return 0
        finally:
            await self.fires.release(gid, hold)

    async def _tick(
        self, state: GoalState, slots: _Slots, taking: tuple[int, int], now: datetime, hold: fires.Hold
    ) -> int:
        store, by = self.store, self.holder
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
        tick = RunOnSchedule(goal_id=gid, slot=slot, attempt=attempt, at=now)
        resume = decide(tick, state, Facts(now=now))
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
    """The attempt that taking ``slot`` now is (a failed, lost or force-completed tick of the slot counts)."""
    return slots.claimed[1] + 1 if slots.claimed[0] == slot else 1


def _forced_since(state: GoalState, slots: _Slots, slot: int) -> bool:
    """Whether ``slot``'s tick resumed the goal and the goal, due again for the same run, has changed since:
    only a forced completion ends a run without counting it (the reference's force complete leaves the
    schedule alone, and its next tick resumes the goal again)."""
    return slots.succeeded == slot and state.position > slots.claimed_position


def _task(goal_id: str) -> str:
    """The task id of a goal schedule's slots."""
    return f"goal:{goal_id}"
