"""The title OpenCode shows above a loopd tool call, worded as the reference words it (its goal tools).

The engine's reply to a tool call carries it as ``title``; the tool file installed in the project hands it to
OpenCode beside the output, so a worker (and its owner reading the transcript) sees "Completion rejected — goal
blocked" rather than a bare JSON answer. Tools the reference titles differently per outcome are told apart by the
reply's ``ok``, ``status`` and message, which are the reference's own words too.
"""

from __future__ import annotations

from typing import Any, Final

_OWNER: Final[dict[str, tuple[str, str | None]]] = {
    # tool: (title when it did it, title when it failed)
    "pause_goal": ("Goal paused", "Pause failed"),
    "resume_goal": ("Goal resumed", "Resume failed"),
    "nudge_goal": ("Goal nudged", "Nudge failed"),
    "abort_goal_worker": ("Worker aborted", "Abort failed"),
    "send_goal_input": ("Message sent", "Send failed"),
    "clear_goal": ("Goal cleared", "Clear failed"),
    "force_complete_goal": ("Goal force-completed", None),
    "force_block_goal": ("Goal blocked", None),
}
_ALREADY: Final = (  # the ends of the reference's messages (a goal's name could hold the words too)
    ("is already paused.", "Already paused"),
    ("is already active.", "Already active"),
    ("already complete.", "Already complete"),
    ("already blocked.", "Already blocked"),
)
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
        return "Goal creation failed" if reply.get("goalID") else "Goal not created"
    if tool in _OWNER:
        return _owner_title(tool, ok, str(reply.get("message") or ""))
    if tool == "list_background_goals":
        if reply.get("ok") is not True:
            return "No session"
        count = len(reply.get("goals") or ())
        return f"{count} active goal(s)" if count else "No active goals"
    if tool == "get_goal":
        name = reply.get("name")
        return f"Goal: {name}" if ok and name is not None else "No active goal"
    if tool == "inspect_background_goal":
        if ok and reply.get("name") is not None:
            return f"Goal: {reply['name']}"
        return "No goal found" if str(reply.get("message") or "").startswith("No matching") else None
    if tool == "loopd_list_models":
        return "Provider/model capabilities" if ok else None
    if tool not in ("report_goal_progress", "complete_goal", "block_goal"):
        return None
    if tool == "complete_goal" and reply.get("passed") is False:
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


def _owner_title(tool: str, ok: bool, message: str) -> str | None:
    if message.startswith("No matching"):
        return "No goal found"
    already = next((title for end, title in _ALREADY if message.endswith(end)), None)
    if already is not None:
        return already
    done, failed = _OWNER[tool]
    return done if ok else failed
