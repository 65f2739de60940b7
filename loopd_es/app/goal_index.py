"""Every goal folded in memory and kept current from what was appended since: what long-lived callers ask.

The OpenCode tool channel answers every call by an owner or a worker session: which goals does this session
own, which goal is this worker's. Folding every goal of the log for each call cost seconds at a few thousand
goals. A :class:`GoalIndex` folds each goal event once: each :meth:`GoalIndex.catch_up` reads only the goal
events appended since the last one (one head query when nothing changed) and keeps each goal's state and the
sessions it belongs to. It is the same fold as a goal's own stream, so a state from the index is the state
:meth:`~loopd_es.app.service.GoalService.load` would return.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

from ..domain.evolve import evolve, initial
from ..domain.streams import GOAL_PREFIX

if TYPE_CHECKING:
    from ..domain.state import GoalState
    from ..log.base import LogStore


class GoalIndex:
    """Goal states by id, and goal ids by owner and by worker session, caught up on demand."""

    def __init__(self, store: LogStore) -> None:
        self.store = store
        self.position = 0
        self.states: dict[str, GoalState] = {}
        self.by_owner: dict[str, set[str]] = {}
        self.by_worker: dict[str, set[str]] = {}
        self._lock = anyio.Lock()
        self._asked = 0
        self._answered = 0

    async def catch_up(self) -> None:
        """Fold the goal events appended since the last call.

        Concurrent callers share one read: a catch-up that began after a caller asked covers it (it saw every
        event committed before the caller asked), so 200 calls at once cost a few reads, not 200.
        """
        self._asked += 1
        ticket = self._asked
        async with self._lock:
            if self._answered >= ticket:
                return
            covers = self._asked
            await self._read()
            self._answered = covers

    async def _read(self) -> None:
        head = await self.store.head()
        if head <= self.position:
            return
        last = self.position
        async for batch in self.store.read_filtered(
            from_position=self.position + 1, stream_prefix=GOAL_PREFIX
        ):
            for env in batch:
                self._apply(env.stream[len(GOAL_PREFIX) :], env)
                last = env.position
        self.position = max(head, last)  # everything up to the head read first was committed before it

    def _apply(self, goal_id: str, env: object) -> None:
        before = self.states.get(goal_id) or initial(goal_id)
        after = evolve(before, env)  # type: ignore[arg-type]
        self.states[goal_id] = after
        for sessions, old, new in (
            (self.by_owner, before.owner_session_id, after.owner_session_id),
            (self.by_worker, before.worker_session_id, after.worker_session_id),
        ):
            if old != new and old is not None:
                sessions.get(old, set()).discard(goal_id)
            if new is not None:
                sessions.setdefault(new, set()).add(goal_id)

    def of_owner(self, session_id: str) -> list[GoalState]:
        """The goals ``session_id`` owns that exist, in id order."""
        return self._existing(self.by_owner.get(session_id, ()))

    def of_worker(self, session_id: str) -> list[GoalState]:
        """The goals whose worker is ``session_id`` that exist, in id order."""
        return self._existing(self.by_worker.get(session_id, ()))

    def existing(self) -> list[GoalState]:
        return self._existing(self.states)

    def _existing(self, ids: object) -> list[GoalState]:
        return [s for goal_id in sorted(ids) if (s := self.states[goal_id]).exists]  # type: ignore[call-overload]
