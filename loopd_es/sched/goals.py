"""Goal schedules (docs/reference/loopd.md#s3-15) fired through the same slot claims as ``/loop`` tasks.

A completed goal with ``schedule.every_ms >= 1000`` and runs left is due at ``next_run_at``. Its tick ``n``
(the run number it starts) is claimed as slot ``n`` on ``loop-goal-<id>`` with an expected version, then the
goal is resumed (``goal.resumed by=schedule`` plus the reference's tick message in its inbox) with the goal
stream's expected version - so a tick that raced a user's change, or another engine, does nothing.
A writer goal waits while another writer goal is active (the reference's ``schedule.skipped-writer-active``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from ..clock import EPOCH
from ..domain.decide import decide
from ..domain.evolve import evolve as goal_evolve
from ..domain.evolve import initial
from ..domain.goal_commands import Facts, RunOnSchedule
from ..domain.loop.due import DueIndex
from ..domain.streams import GOAL_PREFIX, goal_stream
from ..errors import WrongExpectedVersionError
from ..events import loop as ev
from ..events.catalogue import decode_payload, new_event

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
    open_until: datetime = EPOCH
    closed: bool = True


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
                st.last_slot, st.open_until, st.closed = e.slot, e.claim_expires_at, False
            elif isinstance(e, ev.FireSucceeded | ev.FireFailed):
                st.closed = True
                if isinstance(e, ev.FireFailed):
                    st.last_slot = e.slot - 1  # the same slot may be claimed again
            if gid in self.goals:
                self.index.push(goal_due(self.goals[gid]), gid, gid)

    def _writer_active(self, gid: str) -> bool:
        return any(
            o != gid and s.exists and s.is_writer and s.status == "active" for o, s in self.goals.items()
        )

    async def fire_due(self, store: LogStore, now: datetime, *, claimer: str, claim_ttl_ms: int) -> int:
        """Tick every due goal; returns how many were resumed."""
        fired = 0
        for due, gid, _ in self.index.pop_due(now, lambda _s, k: goal_due(self.goals[k])):
            state = self.goals[gid]
            slots = self.slots.get(gid, _Slots())
            slot = state.schedule_run_count + 1
            busy = not slots.closed and slots.open_until > now
            writer_waits = state.is_writer and self._writer_active(gid)
            if writer_waits or busy or slots.last_slot >= slot:
                if writer_waits:
                    log.info("schedule.skipped-writer-active goal=%s", gid)
                self.index.push(due, gid, gid)  # still due: look again next tick
                continue
            fired += await self._tick(store, state, slots, slot, now, claimer, claim_ttl_ms)
        return fired

    async def _tick(
        self,
        store: LogStore,
        state: GoalState,
        slots: _Slots,
        slot: int,
        now: datetime,
        claimer: str,
        ttl: int,
    ) -> int:
        gid = state.goal_id
        key = f"goal:{gid}"
        due = _next_run(state) or now
        claim = ev.SlotClaimed(
            task_id=key,
            slot=slot,
            due_at=due,
            claimed_at=now,
            claimer=claimer,
            claim_expires_at=now + timedelta(milliseconds=ttl),
            goal_id=gid,
        )
        try:
            [claimed] = await store.append(
                ev.goal_slot_stream(gid), [new_event(claim)], expected_version=slots.version
            )
        except WrongExpectedVersionError:
            return 0
        resume = decide(RunOnSchedule(goal_id=gid, slot=slot, at=now), state, Facts(now=now))
        outcome: Event = ev.FireFailed(task_id=key, slot=slot, at=now, reason="goal changed")
        if resume:  # the goal's rules decide the tick; nothing decided: the goal moved on since it was due
            try:
                await store.append(
                    goal_stream(gid),
                    [new_event(e, causation_id=claimed.event_id) for e in resume],
                    expected_version=state.version,
                )
                outcome = ev.FireSucceeded(task_id=key, slot=slot, at=now)
            except WrongExpectedVersionError:
                pass
        await store.append(ev.goal_slot_stream(gid), [new_event(outcome, causation_id=claimed.event_id)])
        return 1 if isinstance(outcome, ev.FireSucceeded) else 0
