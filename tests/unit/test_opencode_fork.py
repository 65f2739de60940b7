"""The OpenCode host's fork against a scripted OpenCode (``httpx.MockTransport``): the message named to
``POST /session/{id}/fork`` is the one *after* the kept ones (OpenCode copies the messages before it), a
server whose ``/doc`` has no fork gets a new session primed with the transcript, and a message that is not in
the session is refused. The real server's fork is ``tests/integration/test_opencode_fork_e2e.py``.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from loopd_es.host.errors import HostRejectedError
from loopd_es.host.opencode import OpenCodeHost

pytestmark = pytest.mark.anyio

MESSAGES = [
    ("msg_1", "user", "write the guide"),
    ("msg_2", "assistant", "read it"),
    ("msg_3", "user", "go on"),
]


class Server:
    def __init__(self, *, forks: bool) -> None:
        self.forks = forks
        self.calls: list[tuple[str, str, Any]] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.calls.append((request.method, request.url.path, body))
        path = request.url.path
        if path == "/doc":
            paths: dict[str, Any] = {"/session/{sessionID}/fork" if self.forks else "/session": {"post": {}}}
            return httpx.Response(200, json={"paths": paths})
        if path == "/session/ses_src/message":
            rows = [
                {
                    "info": {"id": i, "role": r, "time": {"created": 1_700_000_000_000 + n}},
                    "parts": [{"type": "text", "text": t}],
                }
                for n, (i, r, t) in enumerate(MESSAGES)
            ]
            return httpx.Response(200, json=rows)
        if path == "/session/ses_src/fork":
            return httpx.Response(200, json={"id": "ses_fork"})
        if path == "/session" and request.method == "POST":
            return httpx.Response(200, json={"id": "ses_new"})
        if request.method == "PATCH" or path.endswith("/prompt_async"):
            return httpx.Response(204)
        return httpx.Response(404, text="no such thing")


async def fork(server: Server, through: str | None) -> Any:
    host = OpenCodeHost("http://opencode.test", transport=httpx.MockTransport(server.handle))
    try:
        return await host.fork_worker("ses_src", through=through, title="loopd: fork")
    finally:
        await host.aclose()


async def test_the_fork_names_the_message_after_the_last_one_kept() -> None:
    server = Server(forks=True)
    made = await fork(server, "msg_2")
    assert (made.session_id, made.method, made.kept_messages) == ("ses_fork", "fork", 2)
    assert ("POST", "/session/ses_src/fork", {"messageID": "msg_3"}) in server.calls
    assert ("PATCH", "/session/ses_fork", {"title": "loopd: fork"}) in server.calls
    whole = Server(forks=True)
    assert (await fork(whole, "msg_3")).kept_messages == 3
    assert ("POST", "/session/ses_src/fork", {}) in whole.calls  # the last message: the whole session


async def test_a_server_without_fork_gets_a_primed_session() -> None:
    server = Server(forks=False)
    made = await fork(server, "msg_2")
    assert (made.session_id, made.method, made.kept_messages) == ("ses_new", "primed", 2)
    (prompt,) = [body for method, path, body in server.calls if path == "/session/ses_new/prompt_async"]
    assert prompt["noReply"] is True
    text = prompt["parts"][0]["text"]
    assert "[user] write the guide" in text and "[assistant] read it" in text and "go on" not in text
    assert not any(path.endswith("/fork") for _, path, _ in server.calls)


async def test_no_message_yet_means_a_new_session_and_an_unknown_one_is_refused() -> None:
    server = Server(forks=True)
    made = await fork(server, None)
    assert (made.session_id, made.method, made.kept_messages) == ("ses_new", "new", 0)
    with pytest.raises(HostRejectedError) as refused:
        await fork(Server(forks=True), "msg_9")
    assert "msg_9 is not in the session" in refused.value.detail
