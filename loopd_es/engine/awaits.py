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
from ..domain.streams import goal_stream
from ..errors import DuplicateEventIdError
from ..events import goal as g
from ..events.catalogue import new_event

if TYPE_CHECKING:
    from ..events.envelope import Envelope
    from .core import Engine

_NAMESPACE: Final = uuid.UUID("0d7f8a36-3e53-4a4e-8c53-c1a0f6f1e2b7")


def wake_input_id(fire_event_id: str) -> str:
    return f"await:{fire_event_id}"


class AwaitWaker:
    """Turns fired (or discarded) awaits into inbox evidence and a forced turn."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

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
        engine = self.engine
        state = await engine.service.load(goal_id)
        if not state.exists:
            return
        input_id = wake_input_id(env.event_id)
        ctx = Ctx(env.correlation_id or env.event_id, env.event_id)
        payload = g.GoalInputQueued(
            goal_id=goal_id, input_id=input_id, text=str(text), sender="worker", at=env.recorded_at
        )
        event = new_event(
            payload,
            event_id=str(uuid.uuid5(_NAMESPACE, env.event_id)),
            causation_id=env.event_id,
            correlation_id=ctx.correlation_id,
        )
        if input_id not in engine.queued_wakes:
            try:
                await engine.store.append(goal_stream(goal_id), [event], "any")
            except DuplicateEventIdError:
                pass
            engine.service.forget(goal_id)
        await self.wake(goal_id, input_id, ctx)

    async def wake(self, goal_id: str, input_id: str, ctx: Ctx) -> bool:
        """The forced turn, if the evidence ``input_id`` still waits and the goal is active."""
        engine = self.engine
        state = await engine.service.load(goal_id)
        if state.status != "active" or not any(i.input_id == input_id for i in state.inbox):
            return False
        if state.worker_session_id is None:
            return False
        await engine.service.append_goal(
            goal_id, [g.GoalNudged(goal_id=goal_id)], ctx, expected=state.version
        )
        report = await engine.continue_goal(goal_id, ctx, explicit=True, force=True)
        return report is not None and report.result == "started"
