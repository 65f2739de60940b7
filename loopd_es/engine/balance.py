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

from .shares import GoalLostError, Shares, preferred

if TYPE_CHECKING:
    from ..clock import Clock
    from .ports import Holder

log = logging.getLogger("loopd_es.engine")

HANDOVERS_PER_PASS: Final = 8
"""At most this many goals handed to a newly settled member per pass (a join does not stall the fleet)."""


class Balancer:
    """Claims, hand-overs and adoptions of one shared engine."""

    def __init__(self, holder: Holder, shares: Shares, clock: Clock) -> None:
        self.holder = holder
        self.shares = shares
        self.clock = clock
        self.adopted = 0
        self.released = 0

    async def run(self) -> int:
        """One pass; returns how many goals this member claimed."""
        shares, holder = self.shares, self.holder
        if not shares.alive():
            return 0
        await shares.refresh()
        now = self.clock.now()
        members = shares.live_members()
        me = shares.member
        claimed = handed = 0
        for goal_id in holder.goal_ids():
            best = preferred(goal_id, members)
            if goal_id in shares.held:
                state = await holder.load(goal_id)
                try:
                    if state.status != "active" and not holder.pending(goal_id):
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
            state = await holder.load(goal_id)
            claim = shares.claims.get(goal_id)
            finished = claim is not None and claim.released and claim.reason == "finished"
            if not state.exists or (finished and state.status != "active"):
                continue  # a finished goal's notices were recorded before it was given up: nothing left to do
            reason = "stranded" if best != me else "preferred"
            if await shares.claim(goal_id, reason, history=state.status == "active"):
                claimed += 1
                # the running turn is resent only when taken from an engine that died: a goal never claimed
                # or handed over by a live holder had its prompt sent by whoever started the turn
                self.adopted += 1
                await holder.adopt(goal_id, resend=claim is not None and not claim.released)
        return claimed

    def _stranded(self, goal_id: str, now: datetime) -> bool:
        """Unclaimed for two lease lengths after its holder's membership ended (or since first seen)."""
        if goal_id not in self.shares.claims:
            self.shares.note_unclaimed(goal_id)
            return False
        return self.shares.stranded(goal_id, now)
