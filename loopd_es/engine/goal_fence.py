"""The shared engine's fence: every batch a member appends to a goal's stream lands only while it holds that goal.

:class:`GoalFencedStore` is the log as a shared engine sees it. The fence is an explicit argument of the write:
whoever writes about a goal passes that goal's claim (:meth:`~loopd_es.engine.shares.Shares.fence_for`) in the
append's ``fences``, and the store checks it in the append's transaction (:mod:`loopd_es.log.coord`, writing
nothing): once another member claimed the goal, the whole batch fails and the engine is told it lost the goal
(:class:`~loopd_es.engine.shares.GoalLostError`). A batch that writes a goal's stream without that goal's fence
is refused before it reaches the log (:class:`UnfencedWriteError`): an unfenced write would land even after a
takeover, so forgetting the fence is a bug that must be loud. Writes about no goal (a saga checkpoint, a
command's notice) carry no claim.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..domain.streams import aggregate_of
from ..errors import LoopdError
from ..log.coord import Fence, FenceLostError
from .fence import StoreView
from .shares import CLAIM_PREFIX, GoalLostError, Shares, claim_key

if TYPE_CHECKING:
    from ..events.envelope import Envelope
    from ..log.base import LogStore, StreamWrite


class UnfencedWriteError(LoopdError):
    """Raised when a shared engine appends to a goal's stream without that goal's claim among the fences."""

    def __init__(self, goal_id: str, stream: str) -> None:
        super().__init__(
            f"a write to {stream!r} carries no fence for goal {goal_id}: a shared engine must pass the goal's "
            "claim (Shares.fence_for) with every write about it; nothing was written"
        )
        self.goal_id = goal_id


def unfenced_goals(writes: Sequence[StreamWrite], fences: Sequence[Fence]) -> list[str]:
    """The goals whose streams ``writes`` append to without their claim among ``fences``."""
    fenced = {fence.key for fence in fences}
    found: dict[str, None] = {}
    for write in writes:
        kind, ident = aggregate_of(write.stream)
        if kind == "goal" and write.events and claim_key(ident) not in fenced:
            found[ident] = None
    return list(found)


class GoalFencedStore(StoreView):
    """A log that refuses goal writes without the goal's claim and reports a lost claim as a lost goal."""

    def __init__(self, inner: LogStore, shares: Shares) -> None:
        super().__init__(inner)
        self.shares = shares

    async def _fenced(self, writes: list[StreamWrite], fences: Sequence[Fence]) -> list[list[Envelope]]:
        missing = unfenced_goals(writes, fences)
        if missing:
            stream = next(w.stream for w in writes if aggregate_of(w.stream) == ("goal", missing[0]))
            raise UnfencedWriteError(missing[0], stream)
        try:
            return await self.inner.append_many(writes, fences=fences)
        except FenceLostError as e:
            if not e.fence.key.startswith(CLAIM_PREFIX):
                raise
            goal_id = e.fence.key[len(CLAIM_PREFIX) :]
            self.shares.held.pop(goal_id, None)
            raise GoalLostError(goal_id, "claimed by another engine") from None
