"""OpenCode's bus events, messages and errors as the host port's facts (docs/reference/opencode-host.md#s2-1,
#s4, #s5).

Pure functions: what :class:`~loopd_es.host.opencode.OpenCodeHost` does with each ``/event`` payload and each
transcript entry, kept apart so they are tested without a server.
"""

from __future__ import annotations

import contextlib
from typing import Any

import msgspec

from ..clock import from_ms, iso_us
from . import opencode_json as j
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

    :raises msgspec.ValidationError: naming the field when the event's properties are not what OpenCode sends.
    """
    if kind not in _READ:
        return []
    read = j.convert(props, j.PROPS.get(str(kind), j.SessionProps))
    session_id = read.sessionID
    if isinstance(read, j.StatusProps):
        detail = read.status
        if detail.type == "retry":
            return [
                SessionStatusChanged(
                    session_id=session_id,
                    status="retry",
                    message=detail.message,
                    attempt=_int_or_none(detail.attempt),
                    next_at_ms=_int_or_none(detail.next),
                )
            ]
        if detail.type in ("idle", "busy"):
            return [
                SessionStatusChanged(
                    session_id=session_id, status="idle" if detail.type == "idle" else "busy"
                )
            ]
        return []
    if isinstance(read, j.ErrorProps):
        return [SessionError(session_id=session_id, error=normalise_error(read.error))]
    if isinstance(read, j.MessageProps):
        info = read.info
        if info.role not in ("user", "assistant"):
            return []
        if info.role == "user" and seen_users is not None:
            # a prompt appears once; OpenCode updates it again after the turn (its diff summary), which is
            # not the worker doing anything and must not count as activity after the idle
            if info.id in seen_users:
                return []
            if len(seen_users) > 10_000:
                seen_users.clear()
            seen_users.add(info.id)
        return [MessageUpdated(session_id=session_id, message=transcript_message(info, []))]
    if isinstance(read, j.PartProps):
        part = read.part
        if part.type != "tool":
            return []
        call_id = str(part.callID or part.id)
        status = part.state.status
        calls = open_tools.setdefault(session_id, set())
        if status in ("pending", "running") and call_id not in calls:
            calls.add(call_id)
            return [ToolCallStarted(session_id=session_id, call_id=call_id)]
        if status in ("completed", "error") and call_id in calls:
            calls.discard(call_id)
            return [ToolCallEnded(session_id=session_id, call_id=call_id)]
        return []
    if kind == "session.idle":
        return [SessionIdle(session_id=session_id)]
    if kind == "session.compacted":
        return [SessionCompacted(session_id=session_id)]
    if kind == "message.part.delta" and activity:
        return [SessionStatusChanged(session_id=session_id, status="busy")]
    return []


_READ = frozenset(
    {
        "session.idle",
        "session.status",
        "session.error",
        "session.compacted",
        "message.updated",
        "message.part.updated",
        "message.part.delta",
    }
)


def normalise_error(error: dict[str, Any]) -> dict[str, Any]:
    """OpenCode's error (``{name, data: {statusCode, responseHeaders, responseBody, message}}``) in the shape the
    docs/reference/loopd.md#s6 classifier reads, with the provider's ``code``, ``type`` and (Google's)
    ``status`` taken out of the response
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


def transcript_message(info: j.MessageInfo, parts: list[j.Part]) -> TranscriptMessage:
    """One message of a worker's transcript, with its usage (OpenCode's token counts are JavaScript numbers)."""
    times, tokens = info.time, info.tokens
    created, completed = times.created, times.completed
    return TranscriptMessage(
        message_id=info.id,
        role="assistant" if info.role == "assistant" else "user",
        parent_id=info.parentID,
        completed=completed is not None,
        created_at=iso_us(from_ms(created)) if isinstance(created, int | float) else "",
        input=round(tokens.input),
        output=round(tokens.output),
        reasoning=round(tokens.reasoning),
        cache_read=round(tokens.cache.read),
        cache_write=round(tokens.cache.write),
        cost=float(info.cost),
        duration_ms=float(completed - created) if created is not None and completed is not None else 0.0,
        text="".join(p.text or "" for p in parts if p.type == "text"),
        finish=info.finish,
        error=_error_name(info.error),
        tools_running=sum(1 for p in parts if p.type == "tool" and p.state.status in ("pending", "running")),
    )


def _error_name(error: dict[str, Any] | None) -> str | None:
    if not error:
        return None
    name = error.get("name")
    return name if isinstance(name, str) and name else "error"


def _int_or_none(value: object) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
