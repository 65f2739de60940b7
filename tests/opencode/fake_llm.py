"""A fake OpenAI-compatible model server on 127.0.0.1 for OpenCode to talk to: scripted, logged, bounded.

The model named in a request decides how it answers:

- ``good``, ``other``: a short streamed answer with usage (``ok <model>: <start of the prompt>``);
- ``slow``: twenty chunks half a second apart (ten seconds in all), so a turn can be aborted mid-stream;
- ``burst``: two thousand chunks as fast as they can be written (a flood of stream events, for benchmarks);
- ``limited``: 429 ``rate_limit_exceeded`` with ``retry-after: 1``; ``ra<N>``: the same with ``retry-after: N``;
- ``quota``: 429 ``insufficient_quota`` with no header; ``broken``: 500; ``badreq``: 400;
- ``anthropic429``: 429 worded as Anthropic words it (``rate_limit_error``, "This request would exceed the rate
  limit for your organization ..."), no header: OpenCode retries it for about a minute and a half.

A prompt whose last user text contains ``CALL <tool> <json args>`` makes the model call that tool once (the
answer after the tool result is plain text). A worker session (one whose first prompt names ``get_goal``, as the
engine's first turn does) follows :attr:`FakeLLM.worker_script` instead, one step per user turn: ``("call",
tool, args)``, ``("slow", chunks)``, ``("text",)``, ``("flaky",)`` (a 429 with ``retry-after-ms: 100`` at the
turn's first request, then text) or ``("error", status)`` (an error OpenCode does not retry, e.g. 400); the turn
is the number of user messages, so OpenCode's own retries of a turn and the answers after tool results stay on
the same step. With :attr:`FakeLLM.cycle` the script repeats; a request offering no tools (OpenCode's
compaction) always gets text. Every request is logged (model, OpenCode session id, last user
text, tools offered) and the log is served at ``GET /log`` and kept on :attr:`FakeLLM.requests`.
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.waits import let_time_pass

ANTHROPIC_429 = (
    "This request would exceed the rate limit for your organization (4f1a) of 50,000 input tokens per minute. "
    "For details, refer to: https://docs.claude.com/en/api/rate-limits. You can see the response headers for "
    "current usage. Please reduce the prompt length or the maximum tokens requested, or try again later."
)

_CALL = re.compile(r"CALL (\w+) (\{.*\})", re.S)


class FakeLLM:
    """The server: ``start()`` binds a free port on 127.0.0.1; ``base_url`` is what OpenCode's config needs."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.worker_script: list[tuple[Any, ...]] = []
        self.workers: set[str] = set()
        self.cycle = False
        """Repeat :attr:`worker_script` instead of answering text after its end."""
        self.attempts: dict[tuple[str | None, int], int] = {}
        """Requests per (session, turn), so a ``flaky`` step fails only the first."""
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def start(self) -> FakeLLM:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def log(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self.requests.append(entry)

    def models_used(self, session_id: str | None = None) -> list[str]:
        """The model of every chat request so far (of one OpenCode session, when given), in order."""
        with self._lock:
            return [r["model"] for r in self.requests if session_id is None or r["session"] == session_id]


def _handler(fake: FakeLLM) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def do_GET(self) -> None:
            if self.path.rstrip("/") in ("/log", "/v1/log"):
                self._json(200, {"requests": fake.requests})
            elif self.path.rstrip("/") == "/v1/models":
                self._json(200, {"object": "list", "data": []})
            else:
                self._json(404, {"error": {"message": "not found"}})

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._json(404, {"error": {"message": "not found"}})
                return
            model = str(body.get("model", ""))
            messages = body.get("messages") or []
            users = [_text(m) for m in messages if m.get("role") == "user"]
            last_user = users[-1] if users else ""
            tool_answered = bool(messages) and messages[-1].get("role") == "tool"
            session = self.headers.get("x-session-id")
            if session and users and "get_goal" in users[0]:
                fake.workers.add(session)
            fake.log(
                {
                    "model": model,
                    "session": session,
                    "turn": len(users),
                    "last_user": last_user,
                    "tools": sorted(t.get("function", {}).get("name", "") for t in body.get("tools") or []),
                    "at": time.time(),
                }
            )
            if model == "limited" or re.fullmatch(r"ra\d+", model):
                wait = "1" if model == "limited" else model[2:]
                self._error(429, "Rate limit exceeded", "rate_limit_exceeded", {"retry-after": wait})
            elif model == "quota":
                self._error(
                    429,
                    "You exceeded your current quota, please check your plan and billing details.",
                    "insufficient_quota",
                    {},
                )
            elif model == "anthropic429":
                self._json(
                    429, {"type": "error", "error": {"type": "rate_limit_error", "message": ANTHROPIC_429}}
                )
            elif model == "broken":
                self._error(500, "The server had an error", "server_error", {})
            elif model == "badreq":
                self._error(400, "Bad request", "invalid_request_error", {})
            else:
                step: tuple[Any, ...] = ("text",)
                match = _CALL.search(last_user)
                if match is not None:
                    step = ("call", match.group(1), json.loads(match.group(2)))
                elif session in fake.workers and (
                    len(users) <= len(fake.worker_script) or (fake.cycle and fake.worker_script)
                ):
                    if body.get("tools"):  # OpenCode's compaction request offers none: it gets text
                        step = fake.worker_script[(len(users) - 1) % len(fake.worker_script)]
                if step[0] == "flaky":
                    key = (session, len(users))
                    with fake._lock:
                        fake.attempts[key] = fake.attempts.get(key, 0) + 1
                        first = fake.attempts[key] == 1
                    if first:
                        self._error(
                            429, "Rate limit exceeded", "rate_limit_exceeded", {"retry-after-ms": "100"}
                        )
                        return
                    step = ("text",)
                elif step[0] == "error":
                    self._error(int(step[1]), "Bad request", "invalid_request_error", {})
                    return
                if model == "slow":
                    step = ("slow", 20)
                elif model == "burst":
                    step = ("burst", 2000)
                if step[0] == "call" and tool_answered:
                    step = ("text",)
                self._stream(model, last_user, step)

        def _stream(self, model: str, prompt: str, step: tuple[Any, ...]) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("cache-control", "no-cache")
            self.send_header("connection", "close")
            self.end_headers()
            created = int(time.time())

            def chunk(
                delta: dict[str, Any], finish: str | None = None, usage: dict[str, int] | None = None
            ) -> None:
                payload: dict[str, Any] = {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "choices": [] if usage else [{"index": 0, "delta": delta, "finish_reason": finish}],
                }
                if usage:
                    payload["usage"] = usage
                self.wfile.write(f"data: {json.dumps(payload)}\n\n".encode())
                self.wfile.flush()

            try:
                chunk({"role": "assistant", "content": ""})
                if step[0] == "call":
                    chunk(
                        {
                            "tool_calls": [
                                {
                                    "index": 0,
                                    "id": f"call_{time.monotonic_ns() % 10**9}",
                                    "type": "function",
                                    "function": {"name": step[1], "arguments": json.dumps(step[2])},
                                }
                            ]
                        }
                    )
                    chunk({}, "tool_calls")
                    completion = 5
                else:
                    slow = step[0] == "slow"
                    if step[0] in ("slow", "burst"):
                        words = [f"tick{i} " for i in range(int(step[1]))]
                    else:
                        words = [f"ok {model}: ", *prompt.split()[:6]]
                    for word in words:
                        chunk({"content": word + " "})
                        if slow:
                            let_time_pass(0.5, "a slow model: each word takes half a second")
                    chunk({}, "stop")
                    completion = len(words)
                prompt_tokens = 10 + len(prompt.split())
                chunk(
                    {},
                    usage={
                        "prompt_tokens": prompt_tokens,
                        "completion_tokens": completion,
                        "total_tokens": prompt_tokens + completion,
                    },
                )
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):  # the caller aborted the stream
                pass

        def _error(self, status: int, message: str, code: str, headers: dict[str, str]) -> None:
            body = json.dumps({"error": {"message": message, "type": code, "code": code}}).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, value: Any) -> None:
            body = json.dumps(value).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""
