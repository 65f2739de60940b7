"""OpenCode's JSON is decoded by Structs: a field of the wrong type is one error naming it, never coerced.

The HTTP replies go through a scripted OpenCode (``httpx.MockTransport``); the event stream's payloads
through the host's own translation, so a bad event is logged and dropped while the next one still counts.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import msgspec
import pytest

from loopd_es.host.errors import HostReplyError
from loopd_es.host.events import SessionIdle, SessionStatusChanged
from loopd_es.host.opencode import OpenCodeHost
from loopd_es.host.opencode_events import translate_event

pytestmark = pytest.mark.anyio


def _host(routes: dict[str, Any]) -> OpenCodeHost:
    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=routes[request.url.path])

    return OpenCodeHost("http://opencode.test", transport=httpx.MockTransport(handle))


@pytest.mark.parametrize(
    ("props", "field"),
    [
        ({"sessionID": 5}, "`$.sessionID`"),
        ({"sessionID": "s", "status": {"type": "retry", "attempt": "2"}}, "`$.status.attempt`"),
        (
            {"sessionID": "s", "info": {"role": "assistant", "tokens": {"input": "100"}}},
            "`$.info.tokens.input`",
        ),
        ({"sessionID": "s", "info": {"role": "assistant", "cost": "0.1"}}, "`$.info.cost`"),
        ({"sessionID": "s", "part": {"type": "tool", "state": {"status": 1}}}, "`$.part.state.status`"),
    ],
)
def test_an_event_of_the_wrong_shape_names_the_field(props: dict[str, Any], field: str) -> None:
    kind = {
        "status": "session.status",
        "info": "message.updated",
        "part": "message.part.updated",
    }.get(next((k for k in props if k != "sessionID"), ""), "session.idle")
    with pytest.raises(msgspec.ValidationError, match=field.replace("$", r"\$").replace(".", r"\.")):
        translate_event(kind, props, {}, False)


async def test_the_stream_drops_a_bad_event_with_one_warning_and_reads_the_next(
    caplog: pytest.LogCaptureFixture,
) -> None:
    host = _host({})
    bad = {"type": "session.status", "properties": {"sessionID": "ses_1", "status": {"type": 7}}}
    with caplog.at_level(logging.WARNING, logger="loopd_es.host"):
        assert await host._translate(json.dumps(bad)) == []
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "`$.status.type`" in warning.getMessage() and warning.exc_info is None
    good = await host._translate(json.dumps({"type": "session.idle", "properties": {"sessionID": "ses_1"}}))
    assert [type(e) for e in good] == [SessionIdle]
    busy = {"type": "session.status", "properties": {"sessionID": "ses_1", "status": {"type": "busy"}}}
    assert [
        e.status for e in await host._translate(json.dumps(busy)) if isinstance(e, SessionStatusChanged)
    ] == ["busy"]
    await host.aclose()


async def test_a_reply_of_the_wrong_shape_is_a_host_error_naming_the_field() -> None:
    host = _host({"/session/ses_1": {"id": "ses_1", "agent": 3}})
    with pytest.raises(HostReplyError, match=r"`\$\.agent`"):
        await host.session_identity("ses_1")
    await host.aclose()


async def test_usage_counts_are_read_as_numbers_not_guessed_from_text() -> None:
    rows = [
        {
            "info": {
                "id": "msg_1",
                "role": "assistant",
                "parentID": "msg_0",
                "time": {"created": 1000, "completed": 3500},
                "tokens": {"input": 100, "output": 20.0, "reasoning": 0, "cache": {"read": 5, "write": 1}},
                "cost": 0.25,
                "unknownField": {"OpenCode": "adds fields"},
            },
            "parts": [{"type": "text", "text": "done"}, {"type": "tool", "callID": "c1"}],
        }
    ]
    host = _host({"/session/ses_1/message": rows})
    (message,) = await host.messages("ses_1")
    assert (message.input, message.output, message.cache_read, message.cache_write) == (100, 20, 5, 1)
    assert (message.cost, message.duration_ms, message.text, message.parent_id) == (
        0.25,
        2500.0,
        "done",
        "msg_0",
    )
    await host.aclose()
