"""A command as the command tools show it: the reference's CommandSession record (docs/reference/loopd.md#s1-7).

Field names and shapes are the reference's (``ownerSessionID``, ``endReason``, ``watchState{state, matches,
pushes, droppedLines}``, ``createdAt``/``updatedAt``/``endedAt`` ...); a field the reference leaves undefined is
left out, as ``JSON.stringify`` leaves it out. Three fields of loopd-es's own follow it: ``inputBytes`` and the tool
calls that started and last acted on the command (``startedBy``, ``controlledBy``). The CLI's ``--json`` keeps
loopd-es's own snake_case record (README, "Command sessions").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..clock import stamp_or_none
from ..domain.command_notice import NOTIFY_SUCCESSFUL_EXIT

if TYPE_CHECKING:
    from ..domain.command import CommandState
    from ..events.base import Caller


def reference_record(s: CommandState) -> dict[str, Any]:
    """``s`` in the reference's record shape, undefined fields left out."""
    watch = s.watch
    out: dict[str, Any] = {
        "id": s.id,
        "title": s.title,
        "command": s.command,
        "args": list(s.args),
        "shell": True if s.shell else None,
        "endReason": s.end_reason,
        "timeoutSeconds": s.timeout_seconds,
        "deadlineAt": stamp_or_none(s.deadline_at),
        "envKeys": list(s.env_keys) or None,
        "watchFilter": (watch.filter or None) if watch else None,
        "watchUntil": (watch.until or None) if watch else None,
        "watchIgnoreCase": watch.ignore_case if watch else None,
        "watchUntilAction": watch.until_action if watch else None,
        "watchState": {
            "state": s.watch_state,
            "matches": s.watch_matches,
            "pushes": s.watch_pushes,
            "droppedLines": s.watch_dropped_lines,
        }
        if watch
        else None,
        "cwd": s.cwd,
        "ownerSessionID": s.owner_session_id,
        "goalID": s.goal_id,
        "notifyOnExit": s.notify_on_exit,
        "notifySuccessfulExit": True if NOTIFY_SUCCESSFUL_EXIT else None,
        "ownerNotifiedAt": stamp_or_none(s.owner_notified_at),
        "status": s.status,
        "exitCode": s.exit_code,
        "signal": s.signal,
        "pid": s.pid,
        "cols": s.cols,
        "rows": s.rows,
        "outputBytes": s.output_bytes,
        "streamBytes": s.stream_bytes,
        "truncated": s.truncated,
        "createdAt": stamp_or_none(s.created_at),
        "updatedAt": stamp_or_none(s.updated_at or s.ended_at or s.created_at),
        "endedAt": stamp_or_none(s.ended_at),
        "lastError": s.last_error,
        "inputBytes": s.input_bytes,
        "startedBy": _caller(s.started_by),
        "controlledBy": _caller(s.controlled_by),
    }
    return {k: v for k, v in out.items() if v is not None}


def _caller(c: Caller | None) -> dict[str, str] | None:
    if c is None:
        return None
    out = {
        "role": c.role,
        "sessionID": c.session_id,
        "tool": c.tool,
        "messageID": c.message_id,
        "callID": c.call_id,
    }
    return {k: v for k, v in out.items() if v is not None}
