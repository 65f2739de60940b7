"""The shared engine's fence: every batch a member appends about a goal lands only while it holds that goal.

:class:`GoalFencedStore` is the log as a shared engine sees it. The goals a batch concerns are the one the engine
is acting for (:data:`~loopd_es.engine.shares.ACTING_FOR`), the goals whose streams it writes, and the
``goal_id`` its events name (a notice, a saga step). The batch carries a fence on each goal's claim record at
this member's token (:mod:`loopd_es.log.coord`, checked in the append's transaction, writing nothing): once
another member claimed one of those goals, the whole batch fails and the engine is told it lost the goal
(:class:`~loopd_es.engine.shares.GoalLostError`). A batch about no goal at all (a saga checkpoint) is written
plain.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from ..domain.streams import aggregate_of
from ..log.coord import Fence, FenceLostError
from .fence import StoreView
from .shares import ACTING_FOR, CLAIM_PREFIX, GoalLostError, Shares, claim_key

if TYPE_CHECKING:
    from ..events.envelope import Envelope, NewEvent
    from ..log.base import LogStore, StreamWrite

_GOAL_ID = msgspec.json.Decoder(dict[str, Any])


def _named_goal(event: NewEvent) -> str | None:
    data = event.data
    if isinstance(data, dict):
        found = data.get("goal_id")
    elif isinstance(data, msgspec.Raw | bytes | bytearray | memoryview):
        try:
            found = _GOAL_ID.decode(bytes(data)).get("goal_id")
        except msgspec.DecodeError:
            return None
    else:
        found = getattr(data, "goal_id", None)
    return found if isinstance(found, str) and found else None


def goals_of(writes: Sequence[StreamWrite]) -> list[str]:
    """The goals a batch concerns, in a stable order (the engine's current goal first)."""
    found: dict[str, None] = {}
    acting = ACTING_FOR.get()
    if acting is not None:
        found[acting] = None
    for write in writes:
        kind, ident = aggregate_of(write.stream)
        if kind == "goal":
            found[ident] = None
        for event in write.events:
            named = _named_goal(event)
            if named is not None:
                found[named] = None
    return list(found)


class GoalFencedStore(StoreView):
    """A log whose appends about a goal carry this member's claim of it as a fence (reads pass through)."""

    def __init__(self, inner: LogStore, shares: Shares) -> None:
        super().__init__(inner)
        self.shares = shares

    async def _fenced(self, writes: list[StreamWrite], fences: Sequence[Fence]) -> list[list[Envelope]]:
        goals = goals_of(writes)
        if not goals:
            return await self.inner.append_many(writes, fences=fences)
        shares = self.shares
        for goal_id in goals:
            if goal_id not in shares.held:
                raise GoalLostError(goal_id, f"{shares.member} does not hold it")
        if not shares.alive():
            raise GoalLostError(goals[0], f"the membership of {shares.member} ran out")
        claims = [Fence(claim_key(goal_id), shares.held[goal_id]) for goal_id in goals]
        try:
            return await self.inner.append_many(writes, fences=[*fences, *claims])
        except FenceLostError as e:
            prefix = len(CLAIM_PREFIX)
            if not e.fence.key.startswith(CLAIM_PREFIX):
                raise
            goal_id = e.fence.key[prefix:]
            shares.held.pop(goal_id, None)
            raise GoalLostError(goal_id, "claimed by another engine") from None
