"""Command awaits wake their goal (docs/reference/loopd.md#s3-18): evidence to the goal's inbox, then one
forced turn.

The evidence is recorded as ``goal.input_queued`` whose event id is derived from the ``command.await-fired``
event, so replaying the log after a crash records it once. The forced turn is owed exactly while that
evidence is still in the inbox: the turn that carries it records ``goal.input_delivered``, after which the
wake is done. A goal that is not active keeps the evidence for its next active turn (e.g. a retry). An await
discarded because its command record is gone tells the goal why, the same way.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Final

from ..app.service import Ctx
from ..clock import parse_rfc3339
from ..domain import goal_commands as c
from ..errors import DuplicateEventIdError

if TYPE_CHECKING:
    from ..events.envelope import Envelope
    from .ports import GoalLog, TurnDriver

_NAMESPACE: Final = uuid.UUID("0d7f8a36-3e53-4a4e-8c53-c1a0f6f1e2b7")


def wake_input_id(fire_event_id: str) -> str:
    return f"await:{fire_event_id}"


class AwaitWaker:
    """Turns fired (or discarded) awaits into inbox evidence and a forced turn.

    It keeps what it learns from the log about evidence: which is queued already, and (shared mode) which fires
    of goals another member holds are not queued yet, so whoever adopts such a goal reacts to them.
    """

    def __init__(self, goals: GoalLog, turns: TurnDriver) -> None:
        self.goals = goals
        self.turns = turns
        self.queued: set[str] = set()
        """Await evidence already in some goal's inbox (a replayed fire event records nothing again)."""
        self.unqueued: dict[str, Envelope] = {}
        """Fired awaits of goals another member holds, until their evidence is queued."""

    def observe_queued(self, input_id: str) -> None:
        """``goal.input_queued`` of ``input_id`` was read from the log."""
        if input_id.startswith("await:"):
            self.queued.add(input_id)
            self.unqueued.pop(input_id.removeprefix("await:"), None)

    def defer(self, env: Envelope) -> None:
        """A fire of a goal this engine does not hold: kept until its evidence is queued (by anyone)."""
        if env.type == "command.await-fired":
            self.unqueued[env.event_id] = env

    def pending_for(self, goal_id: str) -> bool:
        """Whether a fire of the goal waits for its evidence to be queued."""
        return any(env.data_dict().get("goal_id") == goal_id for env in self.unqueued.values())

    async def adopt(self, goal_id: str, ctx: Ctx) -> None:
        """React to the goal's deferred fires, then owe the forced turn of each evidence still waiting."""
        for event_id, env in list(self.unqueued.items()):
            if env.data_dict().get("goal_id") == goal_id:
                await self.react(env)
                self.unqueued.pop(event_id, None)
        state = await self.goals.load(goal_id)
        for item in state.inbox:
            if item.input_id.startswith("await:") and state.phase != "running":
                await self.wake(goal_id, item.input_id, ctx)

    async def react(self, env: Envelope) -> None:
        data = env.data_dict()
        goal_id = data.get("goal_id")
        if not isinstance(goal_id, str):
            return
        if env.type == "command.await-fired":
            text = data.get("evidence") or f"[command {data.get('command_id')} {data.get('status')}]"
        elif data.get("reason") and "command" in str(data.get("reason")):
            text = f"[await on command {data.get('command_id')} discarded: {data.get('reason')}]"
        else:
            return
        input_id = wake_input_id(env.event_id)
        ctx = Ctx(env.correlation_id or env.event_id, env.event_id)
        if input_id not in self.queued:
            queue = c.QueueEvidence(
                goal_id=goal_id, input_id=input_id, text=str(text), at=parse_rfc3339(env.recorded_at)
            )
            try:  # its id is derived from the fire: a replayed reaction records nothing again
                await self.goals.execute(queue, ctx, event_id=str(uuid.uuid5(_NAMESPACE, env.event_id)))
            except DuplicateEventIdError:
                pass  # recorded before with other words: the evidence is there
        await self.wake(goal_id, input_id, ctx)

    async def wake(self, goal_id: str, input_id: str, ctx: Ctx) -> bool:
        """The forced turn, if the evidence ``input_id`` still waits and the goal is active."""
        if not await self.goals.execute(c.WakeForEvidence(goal_id=goal_id, input_id=input_id), ctx):
            return False
        report = await self.turns.continue_goal(goal_id, ctx, explicit=True, force=True)
        return report is not None and report.result == "started"
