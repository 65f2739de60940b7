"""OpenCode's bus events, messages and errors as the host port's facts (opencode-host.md §2.1, §4, §5).

Pure functions: what :class:`~loopd_es.host.opencode.OpenCodeHost` does with each ``/event`` payload and each
transcript entry, kept apart so they are tested without a server.
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from typing import Any

import msgspec

from .events import (
    AnyHostEvent,
    MessageUpdated,
    SessionCompacted,
    SessionError,
    SessionIdle,
    SessionStatusChanged,
    ToolCallEnded,
    ToolCallStarted,
    TranscriptMessage,
)


def translate_event(
    kind: object,
    props: dict[str, Any],
    open_tools: dict[str, set[str]],
    activity: bool,
    seen_users: set[str] | None = None,
) -> list[AnyHostEvent]:
    """One OpenCode bus event as the host events it means (none for noise).

    ``open_tools`` (session → call ids) turns tool-part state updates into one start and one end per call;
    ``seen_users`` (user message ids) lets a prompt appear once.
    """
    session_id = str(props.get("sessionID"))
    if kind == "session.idle":
        return [SessionIdle(session_id=session_id)]
    if kind == "session.status":
        detail = props.get("status") or {}
        status = detail.get("type")
        if status == "retry":
            return [
                SessionStatusChanged(
                    session_id=session_id,
                    status="retry",
                    message=_str_or_none(detail.get("message")),
                    attempt=_int_or_none(detail.get("attempt")),
                    next_at_ms=_int_or_none(detail.get("next")),
                )
            ]
        if status in ("idle", "busy"):
            return [SessionStatusChanged(session_id=session_id, status=status)]
        return []
    if kind == "session.error":
        return [SessionError(session_id=session_id, error=normalise_error(props.get("error") or {}))]
    if kind == "session.compacted":
        return [SessionCompacted(session_id=session_id)]
    if kind == "message.updated":
        info = props.get("info") or {}
        if info.get("role") not in ("user", "assistant"):
            return []
        if info.get("role") == "user" and seen_users is not None:
            # a prompt appears once; OpenCode updates it again after the turn (its diff summary), which is
            # not the worker doing anything and must not count as activity after the idle
            message_id = str(info.get("id", ""))
            if message_id in seen_users:
                return []
            if len(seen_users) > 10_000:
                seen_users.clear()
            seen_users.add(message_id)
        return [MessageUpdated(session_id=session_id, message=transcript_message(info, []))]
    if kind == "message.part.updated":
        part = props.get("part") or {}
        if part.get("type") != "tool":
            return []
        call_id = str(part.get("callID") or part.get("id"))
        status = (part.get("state") or {}).get("status")
        calls = open_tools.setdefault(session_id, set())
        if status in ("pending", "running") and call_id not in calls:
            calls.add(call_id)
            return [ToolCallStarted(session_id=session_id, call_id=call_id)]
        if status in ("completed", "error") and call_id in calls:
            calls.discard(call_id)
            return [ToolCallEnded(session_id=session_id, call_id=call_id)]
        return []
    if kind == "message.part.delta" and activity:
        return [SessionStatusChanged(session_id=session_id, status="busy")]
    return []


def normalise_error(error: dict[str, Any]) -> dict[str, Any]:
    """OpenCode's error (``{name, data: {statusCode, responseHeaders, responseBody, message}}``) in the shape the
    §6 classifier reads, with the provider's ``code``, ``type`` and (Google's) ``status`` taken out of the response
    body string."""
    raw = error.get("data")
    data: dict[str, Any] = raw if isinstance(raw, dict) else {}
    out: dict[str, Any] = {
        "name": error.get("name"),
        **{k: v for k, v in data.items() if k != "responseBody"},
    }
    body = data.get("responseBody")
    if isinstance(body, str):
        with contextlib.suppress(msgspec.DecodeError):
            parsed = msgspec.json.decode(body)
            inner = parsed.get("error") if isinstance(parsed, dict) else None
            if isinstance(inner, dict):
                if inner.get("code"):
                    out["code"] = inner["code"]
                if inner.get("type"):
                    out["type"] = inner["type"]
                if isinstance(inner.get("status"), str):  # Google's gRPC status, e.g. RESOURCE_EXHAUSTED
                    out["providerStatus"] = inner["status"]
    return {k: v for k, v in out.items() if v is not None}


def transcript_message(info: dict[str, Any], parts: list[dict[str, Any]]) -> TranscriptMessage:
    times = info.get("time") or {}
    tokens = info.get("tokens") or {}
    cache = tokens.get("cache") or {}
    created, completed = times.get("created"), times.get("completed")
    return TranscriptMessage(
        message_id=str(info.get("id", "")),
        role="assistant" if info.get("role") == "assistant" else "user",
        parent_id=info.get("parentID"),
        completed=completed is not None,
        created_at=_iso(created),
        input=int(tokens.get("input") or 0),
        output=int(tokens.get("output") or 0),
        reasoning=int(tokens.get("reasoning") or 0),
        cache_read=int(cache.get("read") or 0),
        cache_write=int(cache.get("write") or 0),
        cost=float(info.get("cost") or 0.0),
        duration_ms=float(completed - created)
        if isinstance(created, int | float) and isinstance(completed, int | float)
        else 0.0,
        text="".join(str(p.get("text", "")) for p in parts if p.get("type") == "text"),
        finish=_str_or_none(info.get("finish")),
        error=_error_name(info.get("error")),
        tools_running=sum(
            1
            for p in parts
            if p.get("type") == "tool" and (p.get("state") or {}).get("status") in ("pending", "running")
        ),
    )


def _error_name(error: object) -> str | None:
    if not error:
        return None
    name = error.get("name") if isinstance(error, dict) else None
    return name if isinstance(name, str) and name else "error"


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _int_or_none(value: object) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _iso(ms: object) -> str:
    if not isinstance(ms, int | float):
        return ""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
