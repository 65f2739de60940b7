"""OpenCode's bus events and errors as host events and classifiable errors (shapes from
docs/reference/opencode-host.md#s4, #s5)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from loopd_es.domain.provider_limit import classify
from loopd_es.host.events import SessionStatusChanged, ToolCallEnded, ToolCallStarted
from loopd_es.host.opencode_events import normalise_error, translate_event

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def api_error(status: int, code: str, message: str, headers: dict[str, str]) -> dict[str, object]:
    body = json.dumps({"error": {"message": message, "type": code, "code": code}})
    return {
        "name": "APIError",
        "data": {
            "message": message,
            "statusCode": status,
            "isRetryable": True,
            "responseHeaders": headers,
            "responseBody": body,
        },
    }


def test_a_quota_error_is_told_from_a_rate_limit_by_the_code_inside_the_response_body() -> None:
    quota = normalise_error(api_error(429, "insufficient_quota", "You exceeded your current quota", {}))
    limit = normalise_error(
        api_error(429, "rate_limit_exceeded", "Rate limit exceeded", {"retry-after": "30"})
    )
    assert quota["code"] == "insufficient_quota" and "responseBody" not in quota
    q, r = classify(quota, "session-error", NOW), classify(limit, "session-error", NOW)
    assert q is not None and q.kind == "quota"
    assert r is not None and r.kind == "rate-limit"


def test_an_abort_is_not_a_provider_limit() -> None:
    aborted = normalise_error({"name": "MessageAbortedError", "data": {"message": "Aborted"}})
    assert aborted == {"name": "MessageAbortedError", "message": "Aborted"}
    assert classify(aborted, "session-error", NOW) is None


def test_tool_parts_become_one_start_and_one_end_per_call() -> None:
    open_tools: dict[str, set[str]] = {}

    def part(status: str) -> dict[str, object]:
        return {
            "sessionID": "ses_1",
            "part": {"type": "tool", "callID": "call_5", "state": {"status": status}},
        }

    events = [
        e
        for s in ("pending", "running", "running", "completed", "completed")
        for e in translate_event("message.part.updated", part(s), open_tools, False)
    ]
    assert events == [
        ToolCallStarted(session_id="ses_1", call_id="call_5"),
        ToolCallEnded(session_id="ses_1", call_id="call_5"),
    ]


def test_streamed_text_is_activity_only_when_the_throttle_lets_it_through() -> None:
    delta = {"sessionID": "ses_1", "messageID": "msg_1", "partID": "prt_1", "field": "text", "delta": "x"}
    assert translate_event("message.part.delta", delta, {}, True) == [
        SessionStatusChanged(session_id="ses_1", status="busy")
    ]
    assert translate_event("message.part.delta", delta, {}, False) == []
    assert translate_event("plugin.added", {"sessionID": "ses_1"}, {}, False) == []


def test_a_retry_status_keeps_the_providers_message_attempt_and_next_time() -> None:
    props = {
        "sessionID": "ses_1",
        "status": {"type": "retry", "attempt": 2, "message": "Rate limit exceeded", "next": 1796237854801},
    }
    assert translate_event("session.status", props, {}, False) == [
        SessionStatusChanged(
            session_id="ses_1",
            status="retry",
            message="Rate limit exceeded",
            attempt=2,
            next_at_ms=1796237854801,
        )
    ]
    limit = classify({"message": "Rate limit exceeded"}, "session-error", NOW)
    quota = classify(
        {"message": "You exceeded your current quota, please check your plan and billing details."},
        "session-error",
        NOW,
    )
    assert limit is not None and limit.kind == "rate-limit"
    assert quota is not None and quota.kind == "quota"


def test_a_prompt_appears_once_and_its_later_summary_update_is_not_activity() -> None:
    seen: set[str] = set()
    user = {"sessionID": "ses_1", "info": {"id": "msg_1", "role": "user", "time": {"created": 1}}}
    assert len(translate_event("message.updated", user, {}, False, seen)) == 1
    summary = {"sessionID": "ses_1", "info": {**user["info"], "summary": {"diffs": []}}}  # type: ignore[dict-item]
    assert translate_event("message.updated", summary, {}, False, seen) == []
    assistant = {"sessionID": "ses_1", "info": {"id": "msg_2", "role": "assistant", "parentID": "msg_1"}}
    assert len(translate_event("message.updated", assistant, {}, False, seen)) == 1
    assert len(translate_event("message.updated", assistant, {}, False, seen)) == 1  # answers do update


def test_a_transcript_entry_tells_how_the_answer_ended() -> None:
    """What the idle confirmation proves a turn's end from (docs/reference/opencode-host.md#s2-1, #s2-3,
    #s5)."""
    import msgspec

    from loopd_es.host import opencode_json as j
    from loopd_es.host.opencode_events import transcript_message

    def entry(info: dict[str, object], parts: list[dict[str, object]]) -> object:
        row = msgspec.convert({"info": info, "parts": parts}, j.MessageRow)
        return transcript_message(row.info, row.parts)

    done = entry({"id": "m", "role": "assistant", "finish": "stop", "time": {"completed": 2}}, [])
    assert (done.finish, done.error, done.tools_running) == ("stop", None, 0)  # type: ignore[attr-defined]
    failed = entry(
        {"id": "m", "role": "assistant", "error": {"name": "APIError", "data": {}}, "time": {"completed": 2}},
        [],
    )
    assert (failed.finish, failed.error) == (None, "APIError")  # type: ignore[attr-defined]
    tools: list[dict[str, object]] = [
        {"type": "tool", "state": {"status": status}}
        for status in ("pending", "running", "completed", "error")
    ]
    assert entry({"id": "m", "role": "assistant"}, tools).tools_running == 2  # type: ignore[attr-defined]
