"""Who may call which tool: the engine's own check, not only the per-prompt tools map OpenCode is sent.

A worker session's prompts carry a tools map that hides the owner tools, but that map is advice to the model:
a worker that calls ``loopd_create_goal`` anyway must not end up owning goals, pausing its own goal or
starting commands. So every call is checked against the calling session's role as the log records it:

- a session that is the worker of a goal may call the worker tools only (and ``loopd_list_models``, which
  shows it the catalogs and none of its owner's goals);
- a worker tool called by a session that is no goal's worker but owns goals is told so (the reference's own
  "No active goal" would hide the mistake).

Owner tools that name a goal check its owner themselves (:meth:`ToolDispatcher._owned
<loopd_es.engine.tool_api.ToolDispatcher._owned>`).
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Final

from ..events.base import Caller

if TYPE_CHECKING:
    from ..app.goal_index import GoalIndex
    from .tool_spec import ToolSpec

WORKER_TOOL_NAMES: Final = ("get_goal", "report_goal_progress", "complete_goal", "block_goal")

OPEN_TO_WORKERS: Final = ("loopd_list_models",)
"""Owner tools a worker session may call too: the reference answers it with the catalogs and no goals
(``assignedGoals: []``, docs/reference/loopd.md#s3-21)."""

CALLER: Final[ContextVar[Caller | None]] = ContextVar("loopd_tool_caller", default=None)
"""The tool call being answered in this task: the operations it runs stamp it on the events they record."""


def caller_of(spec: ToolSpec, session: str, context: dict[str, Any]) -> Caller:
    """Who is calling: the tool's role, the session, and OpenCode's message and call ids (when it sent them)."""

    def text(key: str) -> str | None:
        value = context.get(key)
        return value if isinstance(value, str) and value else None

    return Caller(
        role="worker" if spec.role == "worker" else "owner",
        session_id=session,
        tool=spec.name,
        message_id=text("messageID"),
        call_id=text("callID"),
    )


async def role_refusal(spec: ToolSpec, session: str, index: GoalIndex) -> dict[str, Any] | None:
    """The reply refusing ``session`` the tool ``spec``, or ``None`` when its role allows the call."""
    await index.catch_up()
    if spec.role == "owner":
        worked = index.of_worker(session)
        if worked and spec.name not in OPEN_TO_WORKERS:
            goal = worked[0]
            return {
                "ok": False,
                "errorCode": "wrong_role",
                "message": f'{spec.name} is an owner tool, and session {session} is the worker of goal "{goal.name}" '
                f"({goal.goal_id}): a worker may call only {', '.join(WORKER_TOOL_NAMES)}.",
            }
        return None
    if not index.of_worker(session) and index.of_owner(session):
        return {
            "ok": False,
            "errorCode": "wrong_role",
            "message": f"{spec.name} is a worker tool, and session {session} is no goal's worker (it owns goals): "
            "only a goal's worker session reports on it.",
        }
    return None
