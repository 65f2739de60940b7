"""The shared engine's fence: every batch a member appends about a goal lands with that goal's claim, or not at all.

:class:`GoalFencedStore` is the log as a shared engine sees it. The goals a batch concerns are the one the engine
is acting for (:data:`~loopd_es.engine.shares.ACTING_FOR`), the goals whose streams it writes, and the
``goal_id`` its events name (a notice, a saga step). The batch is appended in one ``append_many`` together with
one ``engine.goal_fenced`` event per goal, each at the claim stream version this member last wrote: once
another member claimed one of those goals, the whole batch fails and the engine is told it lost the goal
(:class:`~loopd_es.engine.shares.GoalLostError`). A batch about no goal at all (a saga checkpoint) is written
plain; resending events already recorded writes nothing and needs no fence.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from ..domain.streams import aggregate_of
from ..errors import DuplicateEventIdError, WrongExpectedVersionError
from ..events import engine as en
from ..events.catalogue import new_event
from ..events.envelope import ANY
from ..log.base import StreamWrite, WriteSpec
from .fence import StoreView
from .shares import ACTING_FOR, CLAIM_PREFIX, MEMBERS_STREAM, GoalLostError, Shares, claim_stream

if TYPE_CHECKING:
    from ..events.envelope import Envelope, ExpectedVersion, NewEvent
    from ..log.base import LogStore
    from ..log.group_commit import Request

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
    """A log whose appends about a goal carry this member's claim of it atomically (reads pass through)."""

    def __init__(self, inner: LogStore, shares: Shares) -> None:
        super().__init__(inner)
        self.shares = shares

    async def append(
        self, stream: str, events: Sequence[NewEvent], expected_version: ExpectedVersion = ANY
    ) -> list[Envelope]:
        recorded = await self._write([StreamWrite(stream, events, expected_version)])
        return recorded[0]

    async def append_many(self, writes: Sequence[WriteSpec]) -> list[list[Envelope]]:
        return await self._write([StreamWrite(*write) for write in writes])

    async def _submit(self, request: Request) -> list[Envelope]:
        writes = [StreamWrite(part.stream, part.events, part.expected) for part in request.parts]
        return [env for out in await self._write(writes) for env in out]

    async def _write(self, writes: list[StreamWrite]) -> list[list[Envelope]]:
        if not any(w.events for w in writes) or any(
            w.stream == MEMBERS_STREAM or w.stream.startswith(CLAIM_PREFIX) for w in writes
        ):
            return await self.inner.append_many(writes)
        goals = goals_of(writes)
        if not goals:
            return await self.inner.append_many(writes)
        shares = self.shares
        async with shares.lock:  # a claim or release meanwhile would move the versions these fences sit on
            for goal_id in goals:
                if goal_id not in shares.held:
                    raise GoalLostError(goal_id, f"{shares.member} does not hold it")
            if not shares.alive():
                raise GoalLostError(goals[0], f"the membership of {shares.member} ran out")
            fences = [
                StreamWrite(
                    claim_stream(goal_id),
                    [
                        new_event(
                            en.EngineGoalFenced(
                                goal_id=goal_id,
                                member=shares.member,
                                token=shares.held[goal_id],
                                stream=writes[0].stream,
                            )
                        )
                    ],
                    shares.held[goal_id],
                )
                for goal_id in goals
            ]
            try:
                recorded = await self.inner.append_many([*writes, *fences])
            except WrongExpectedVersionError:
                for goal_id in goals:
                    if await self.inner.stream_version(claim_stream(goal_id)) != shares.held[goal_id]:
                        shares.held.pop(goal_id, None)
                        raise GoalLostError(goal_id, "claimed by another engine") from None
                raise
            except DuplicateEventIdError:
                # recorded before (a retry after a crash or by another path): nothing new, nothing to fence
                return await self.inner.append_many(writes)
            for goal_id in goals:
                shares.held[goal_id] += 1
            return recorded[: len(writes)]
