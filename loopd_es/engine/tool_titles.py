"""The title OpenCode shows above a loopd tool call, worded as the reference words it (its goal tools).

The engine's reply to a tool call carries it as ``title``; the tool file installed in the project hands it to
OpenCode beside the output, so a worker (and its owner reading the transcript) sees "Completion rejected — goal
blocked" rather than a bare JSON answer. Tools the reference titles differently per outcome are told apart by the
reply's ``ok``, ``status`` and message, which are the reference's own words too.
"""

from __future__ import annotations

from typing import Any, Final

_WORKER_REFUSALS: Final = (
    ("No active goal", "No goal"),
    ("Goal is ", "Invalid state"),
    ("Cannot ", "Invalid transition"),
)


def title_for(tool: str, reply: dict[str, Any]) -> str | None:
    """The title for ``tool``'s ``reply``, or ``None`` where the reference gives none this engine knows."""
    ok = reply.get("ok") is True
    if tool == "loopd_create_goal":
        if ok:
            return "Goal created"
        return "Goal creation failed" if reply.get("goal_id") else "Goal not created"
    if tool == "get_goal":
        name = (reply.get("data") or {}).get("name")
        return f"Goal: {name}" if ok and name is not None else "No active goal"
    if tool not in ("report_goal_progress", "complete_goal", "block_goal"):
        return None
    data = reply.get("data") or {}
    if tool == "complete_goal" and data.get("passed") is False:
        blocked = reply.get("status") == "blocked"
        return "Completion rejected — goal blocked" if blocked else "Completion rejected — keep working"
    if ok:
        return {
            "report_goal_progress": "Progress recorded",
            "complete_goal": "Goal completed",
            "block_goal": "Goal blocked",
        }[tool]
    message = str(reply.get("message") or "")
    return next((title for prefix, title in _WORKER_REFUSALS if message.startswith(prefix)), None)
