"""A shared engine's balance pass: claim the goals it should turn, hand over or give up the rest, adopt.

Run every few hundred milliseconds by ``loopd-es run --shared`` (:mod:`loopd_es.engine.daemon`), after the
engine caught up with the log; each pass first reads the members and claims from the coordination records. The rules are in
:mod:`loopd_es.engine.shares`; this module applies them to the goals the engine knows and, for each goal it
claims, *adopts* it: whatever its previous holder may have left half done is finished exactly as a restarted
engine finishes it (an open identity switch, the goal's notices, fired awaits, the running turn's prompt,
the timers).
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING, Final

from ..app.service import Ctx
from ..clock import parse_rfc3339
from ..domain.streams import goal_stream
from ..errors import StreamNotFoundError
from .notices import NOTICE_TYPES
from .shares import GoalLostError, Shares, acting_for, preferred

if TYPE_CHECKING:
    from .core import Engine

log = logging.getLogger("loopd_es.engine")

HANDOVERS_PER_PASS: Final = 8
"""At most this many goals handed to a newly settled member per pass (a join does not stall the fleet)."""


class Balancer:
    """Claims, hand-overs and adoptions of one shared engine."""

    def __init__(self, engine: Engine, shares: Shares) -> None:
        self.engine = engine
        self.shares = shares
        self.adopted = 0
        self.released = 0

    async def run(self) -> int:
        """One pass; returns how many goals this member claimed."""
        shares, engine = self.shares, self.engine
        if not shares.alive():
            return 0
        await shares.refresh()
        now = engine.clock.now()
        members = shares.live_members()
        me = shares.member
        claimed = handed = 0
        for goal_id in list(engine.tracker.goals):
            best = preferred(goal_id, members)
            if goal_id in shares.held:
                state = await engine.service.load(goal_id)
                try:
                    if state.status != "active" and not self._pending(goal_id):
                        await shares.release(goal_id, "finished")
                        self.released += 1
                    elif (
                        best is not None
                        and best != me
                        and handed < HANDOVERS_PER_PASS
                        and shares.settled(best, now)
                    ):  # mid-turn too: the new holder picks the turn up as a restarted engine would
                        await shares.release(goal_id, "rebalance")
                        handed += 1
                        self.released += 1
                except GoalLostError:
                    pass
                continue
            # the view decides first; only a goal this member would claim is read from the log
            if not shares.claimable(goal_id, now):
                continue
            if best != me and not self._stranded(goal_id, now):
                continue
            state = await engine.service.load(goal_id)
            claim = shares.claims.get(goal_id)
            finished = claim is not None and claim.released and claim.reason == "finished"
            if not state.exists or (finished and state.status != "active"):
                continue  # a finished goal's notices were recorded before it was given up: nothing left to do
            if await shares.claim(goal_id, "stranded" if best != me else "preferred"):
                claimed += 1
                # the running turn is resent only when taken from an engine that died: a goal never claimed
                # or handed over by a live holder had its prompt sent by whoever started the turn
                await self.adopt(goal_id, resend=claim is not None and not claim.released)
        return claimed

    def _stranded(self, goal_id: str, now: datetime) -> bool:
        """Unclaimed for two lease lengths after its holder's membership ended (or since first seen)."""
        if goal_id not in self.shares.claims:
            self.shares.note_unclaimed(goal_id)
            return False
        return self.shares.stranded(goal_id, now)

    def _pending(self, goal_id: str) -> bool:
        """Notices or awaits of the goal still to be handled (its holder keeps it until they are)."""
        engine = self.engine
        if any(p.goal_id == goal_id for p in engine.outbox.pending.values()):
            return True
        return any(env.data_dict().get("goal_id") == goal_id for env in engine.unqueued_fires.values())

    async def adopt(self, goal_id: str, *, resend: bool = True) -> None:
        """Finish what the goal's previous holder may have left half done, as a restart would."""
        engine = self.engine
        self.adopted += 1
        ctx = Ctx.new()
        try:
            with acting_for(goal_id):
                await engine.goals.recover(ctx, only=goal_id)
                await self._replay_notices(goal_id)
                for event_id, env in list(engine.unqueued_fires.items()):
                    if env.data_dict().get("goal_id") == goal_id:
                        await engine.awaits.react(env)
                        engine.unqueued_fires.pop(event_id, None)
                state = await engine.service.load(goal_id)
                for item in state.inbox:
                    if item.input_id.startswith("await:") and state.phase != "running":
                        await engine.awaits.wake(goal_id, item.input_id, ctx)
                state = await engine.service.load(goal_id)
                if state.status == "active" and state.phase == "running":
                    if resend:
                        await engine.turns.resend(goal_id, ctx)
                    engine.tracker.schedule(goal_id, "confirm", engine.clock.now())
                elif state.status == "active" and state.phase == "waiting_retry" and state.retry_after:
                    engine.tracker.schedule(goal_id, "retry", parse_rfc3339(state.retry_after))
        except GoalLostError as e:
            log.info("lost a goal while adopting it: %s", e)
        await engine.catch_up()

    async def _replay_notices(self, goal_id: str) -> None:
        """Record the notices the goal's events call for that nobody recorded yet (recording is idempotent)."""
        engine = self.engine
        try:
            events = [
                e async for e in engine.store.read_stream(goal_stream(goal_id)) if e.type in NOTICE_TYPES
            ]
        except StreamNotFoundError:
            return
        for env in events:
            await engine.notice(env)
