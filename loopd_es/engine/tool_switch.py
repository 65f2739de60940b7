"""``switch_goal_identity``'s answer, as the reference's owner tool gives it (docs/reference/loopd.md#s3-10).

The tool checks what it can before the switch (a field to switch, a goal this session owns) and answers each
with its own title; the switch itself is the same one ``loopd-es goal switch`` runs (``--resume`` included).
Whatever the switch refuses or fails on is answered with one fixed message that names no secret and no host
text: the goal and its worker session are kept, and the model is pointed at ``loopd_list_models`` and
``inspect_background_goal`` to see why. A switch that was taken answers its outcome (``applied``, ``deferred``
or ``unsupported``), the fields it switched, and whether the goal was resumed.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final

from ..domain.rules import NOT_OWNED
from ..errors import LoopdError
from ..sagas.identity_switch import REJECTED

if TYPE_CHECKING:
    from ..domain.state import GoalState
    from .operations import Operations

log = logging.getLogger("loopd_es.engine.tools")

RETAINED: Final = (
    "Same goal and worker retained. Deferred requests require the next permitted idle turn; no automatic "
    "interactive wake."
)
_TAKEN: Final = {
    "applied": "applied",
    "next-prompt": "deferred",
    "deferred": "deferred",
    "unsupported": "unsupported",
}
"""The outcomes the tool reports (a host that applies on the next prompt is reported deferred, step 8)."""


def rejected() -> dict[str, Any]:
    """The answer to a switch the rules or the host refused: nothing changed, one fixed message."""
    return {"ok": False, "message": REJECTED, "title": "Identity switch failed"}


async def switch_reply(
    ops: Operations,
    owned: list[GoalState],
    session: str,
    goal_id: str,
    model: str | None,
    agent: str | None,
    *,
    resume: bool,
) -> dict[str, Any]:
    """Switch ``goal_id``'s identity for ``session`` (its owner) and answer as the reference's tool does.

    ``model``/``agent`` are ``None`` only when absent: ``""`` goes to the rules, which refuse it.
    """
    if model is None and agent is None:
        return {
            "ok": False,
            "message": "At least one of model or agent is required.",
            "title": "Identity switch failed",
        }
    goal = next((g for g in owned if g.goal_id == goal_id and g.owner_session_id == session), None)
    if goal is None:
        return {"ok": False, "message": NOT_OWNED, "title": "Switch denied"}
    if goal.pending_identity is not None:  # the rules fill the missing half from the pending pair
        model = model if model is not None else goal.pending_identity.model
        agent = agent if agent is not None else goal.pending_identity.agent
    try:
        result = await ops.switch_identity(goal.goal_id, model=model, agent=agent, resume=resume)
    except LoopdError as e:
        log.info("switch_goal_identity on goal %s refused: %s", goal.goal_id, e)
        return rejected()
    outcome = _TAKEN.get(str(result.data.get("outcome")))
    if outcome is None:  # failed, rolled back, rollback failed: the host did not take it
        log.info("switch_goal_identity on goal %s: %s", goal.goal_id, result.message)
        return rejected()
    reply: dict[str, Any] = {"ok": outcome != "unsupported", "outcome": outcome}
    if model is not None:
        reply["model"] = result.data.get("model") or model
    if agent is not None:
        reply["agent"] = result.data.get("agent") or agent
    if result.data.get("resumed"):
        reply["resumed"] = True
    return {**reply, "goalID": goal.goal_id, "message": RETAINED, "title": f"Identity switch: {outcome}"}
