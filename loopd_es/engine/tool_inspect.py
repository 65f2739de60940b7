"""``inspect_background_goal``: one of the caller's goals in full, and what its worker is doing now.

The owner notices of maintenance and a refused switch send the model here (docs/reference/loopd.md#s3-22,
#s3-10). The answer is the goal as :func:`~.tool_views.inspect_view` shows it, with what the reference reads
live beside the state: the worker's last messages (1 to 10, default 3, 400 characters each, given up on after
900 ms), the goal's last five progress reports, the artifact directory's contents, and the last three inputs
waiting for the worker. A live read that fails leaves its field out; the answer never fails for it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Final

import anyio
from msgspec import UnsetType

from ..domain.streams import goal_stream
from ..errors import LoopdError
from .tool_views import inspect_view

if TYPE_CHECKING:
    from ..domain.state import GoalState
    from ..host.events import EngineHost
    from ..log.base import LogStore
    from .tool_args import InspectArgs

TRANSCRIPT_TIMEOUT_S: Final = 0.9
PROGRESS_KEPT: Final = 5


async def inspect_reply(
    store: LogStore, host: EngineHost, goal: GoalState, args: InspectArgs
) -> dict[str, Any]:
    """The answer to ``inspect_background_goal`` on ``goal`` (found and owned by the caller)."""
    live: dict[str, Any] = {}
    summary = _artifacts(goal.config.artifact_dir)
    if summary is not None:
        live["artifactSummary"] = summary
    if args.includeTranscript is not False and goal.worker_session_id is not None:
        wanted = 3 if isinstance(args.transcriptLimit, UnsetType) else args.transcriptLimit
        tail = await _transcript(host, goal.worker_session_id, max(1, min(10, int(wanted))))
        if tail is not None:
            live["transcriptTail"] = tail
    live["activeToolCallIDs"] = list(goal.active_tool_call_ids)
    live["pendingToolCalls"] = len(goal.active_tool_call_ids)
    return {"ok": True, **inspect_view(goal, live, await _progress(store, goal.goal_id))}


def _artifacts(directory: str | None) -> str | None:
    if not directory:
        return None
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return "no artifacts yet"
    return f"{len(names)} file(s): {', '.join(names[:8])}" if names else "no artifacts yet"


async def _transcript(host: EngineHost, session: str, limit: int) -> list[dict[str, Any]] | None:
    with anyio.move_on_after(TRANSCRIPT_TIMEOUT_S):
        try:
            messages = await host.messages(session, limit=limit)
        except LoopdError:
            return None
        return [
            {
                k: v
                for k, v in {
                    "role": m.role,
                    "content": m.text[:400],
                    "timestamp": m.created_at or None,
                    "messageID": m.message_id,
                    "parentMessageID": m.parent_id,
                }.items()
                if v is not None
            }
            for m in messages[-limit:]
        ]
    return None


async def _progress(store: LogStore, goal_id: str) -> list[dict[str, Any]]:
    """The goal's last :data:`PROGRESS_KEPT` progress reports: summary (120), next (80), when."""
    found: list[dict[str, Any]] = []
    async for env in store.read_stream(goal_stream(goal_id)):
        if env.type == "goal.progress":
            data = env.data_dict()
            entry = {"summary": str(data.get("summary") or "")[:120]}
            if data.get("next"):
                entry["next"] = str(data["next"])[:80]
            entry["at"] = str(data.get("at") or env.recorded_at)
            found = [*found[-(PROGRESS_KEPT - 1) :], entry]
    return found
