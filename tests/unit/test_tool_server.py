"""The tool channel's h11 server on a real Unix socket: framing, refusals, statuses, the socket's privacy, takeover.

Every exchange is raw bytes over the socket, so what a client sees (status line, reason, JSON body, whether the
connection is answered or just closed) is what is asserted.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from loopd_es.engine import tool_server
from loopd_es.engine.tool_api import ToolCall, tool_handler
from loopd_es.engine.tool_server import MAX_BODY, Handler, private_socket_dir, serve
from loopd_es.procs.paths import UnsafeDirectoryError
from tests.waits import await_until, scaled_timeout

from .._profiles import scaled

pytestmark = pytest.mark.anyio

TOKEN = "s3cret-token"
Reply = tuple[int, str, dict[str, str], bytes]


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short private directory (pytest's tmp_path can be longer than a socket path may be)."""
    with tempfile.TemporaryDirectory(prefix="ts-") as d:
        yield Path(d) / "run"


class Recorder:
    """A handler that records what it was given and answers with a chosen status."""

    def __init__(self, status: int = 200) -> None:
        self.calls: list[tuple[str, bytes]] = []
        self.status = status

    async def __call__(self, route: str, body: bytes) -> tuple[int, bytes]:
        self.calls.append((route, body))
        return self.status, json.dumps({"ok": True, "route": route, "size": len(body)}).encode()


@asynccontextmanager
async def serving(path: Path, handler: Handler) -> AsyncIterator[Path]:
    async with anyio.create_task_group() as tg:
        await tg.start(serve, path, TOKEN, handler)
        yield path
        tg.cancel_scope.cancel()


async def exchange(path: Path, raw: bytes, *, eof: bool = False) -> list[Reply]:
    """Send ``raw`` (then end our side, with ``eof``), read until the server closes, split what came back into
    responses."""
    async with await anyio.connect_unix(path) as stream:
        await stream.send(raw)
        if eof:
            await stream.send_eof()
        data = b""
        with anyio.fail_after(scaled_timeout(5)):
            while True:
                try:
                    data += await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    break
    replies = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        _, status, reason = lines[0].split(" ", 2)
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        size = int(headers["content-length"])
        replies.append((int(status), reason, headers, rest[:size]))
        data = rest[size:]
    return replies


def post(
    body: bytes, *, token: str = TOKEN, extra: str = "", close: bool = True, route: str = "/tool"
) -> bytes:
    head = f"POST {route} HTTP/1.1\r\nHost: loopd-es\r\nAuthorization: Bearer {token}\r\n{extra}"
    if "Transfer-Encoding" not in extra and "Content-Length" not in extra:
        head += f"Content-Length: {len(body)}\r\n"
    return (head + ("Connection: close\r\n" if close else "") + "\r\n").encode() + body


async def one(path: Path, raw: bytes) -> Reply:
    replies = await exchange(path, raw)
    assert len(replies) == 1, replies
    return replies[0]


def message(reply: Reply) -> str:
    value = json.loads(reply[3])
    assert value["ok"] is False
    return str(value["message"])


async def test_a_post_reaches_the_handler_and_its_answer_comes_back(sock_dir: Path) -> None:
    handler = Recorder()
    async with serving(sock_dir / "t.sock", handler) as path:
        status, reason, headers, body = await one(path, post(b'{"tool": "x"}'))
    assert (status, reason, headers["content-type"]) == (200, "OK", "application/json")
    assert json.loads(body) == {"ok": True, "route": "/tool", "size": 13}
    assert handler.calls == [("/tool", b'{"tool": "x"}')]


async def test_a_chunked_body_is_reassembled(sock_dir: Path) -> None:
    handler = Recorder()
    chunks = b'5\r\n{"a":\r\n4\r\n 12}\r\n0\r\n\r\n'
    async with serving(sock_dir / "t.sock", handler) as path:
        status, *_ = await one(path, post(chunks, extra="Transfer-Encoding: chunked\r\n"))
    assert status == 200
    assert handler.calls == [("/tool", b'{"a": 12}')]


async def test_kept_alive_connections_serve_request_after_request(sock_dir: Path) -> None:
    handler = Recorder()
    async with serving(sock_dir / "t.sock", handler) as path:
        replies = await exchange(path, post(b"1", close=False) + post(b"22", close=False) + post(b"333"))
    assert [r[0] for r in replies] == [200, 200, 200]
    assert [body for _, body in handler.calls] == [b"1", b"22", b"333"]


@pytest.mark.parametrize(
    ("extra", "status"),
    [
        ("Content-Length: -5\r\n", 400),
        ("Content-Length: 12abc\r\n", 400),
        (f"Content-Length: {MAX_BODY + 1}\r\n", 413),
        ("Content-Length: 99999999999999999999\r\n", 413),
        ("Content-Length: 99999999999999999999999\r\n", 400),  # more digits than h11 reads
    ],
)
async def test_bad_content_lengths_are_refused_before_the_handler(
    sock_dir: Path, extra: str, status: int
) -> None:
    handler = Recorder()
    async with serving(sock_dir / "t.sock", handler) as path:
        reply = await one(path, post(b"{}", extra=extra))
    assert reply[0] == status and reply[1]
    assert message(reply)
    assert handler.calls == []


async def test_a_chunked_body_over_the_limit_is_refused(sock_dir: Path) -> None:
    handler = Recorder()
    size = MAX_BODY + 10
    chunked = f"{size:x}\r\n".encode() + b"x" * size + b"\r\n0\r\n\r\n"
    async with serving(sock_dir / "t.sock", handler) as path:
        reply = await one(path, post(chunked, extra="Transfer-Encoding: chunked\r\n"))
    assert reply[0] == 413
    assert "over the limit" in message(reply)
    assert handler.calls == []


@pytest.mark.parametrize(
    "raw",
    [
        b"garbage\r\n\r\n",
        b"POST /tool HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",  # HTTP/1.1 without Host
        b"POST /tool HTTP/1.1\r\nHost: x\r\nbad header line\r\n\r\n",
        b"POST /tool HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ],
)
async def test_malformed_requests_get_a_400_with_a_json_error(sock_dir: Path, raw: bytes) -> None:
    handler = Recorder()
    async with serving(sock_dir / "t.sock", handler) as path:
        reply = await one(path, raw)
    assert (reply[0], reply[1]) == (400, "Bad Request")
    assert message(reply).startswith("malformed request")
    assert handler.calls == []


@pytest.mark.parametrize("token", ["", "wrong", TOKEN + "x"])
async def test_a_call_without_the_token_is_refused(sock_dir: Path, token: str) -> None:
    handler = Recorder()
    async with serving(sock_dir / "t.sock", handler) as path:
        reply = await one(path, post(b"{}", token=token))
    assert (reply[0], reply[1]) == (401, "Unauthorized")
    assert "token" in message(reply)
    assert handler.calls == []


async def test_only_post_is_served(sock_dir: Path) -> None:
    async with serving(sock_dir / "t.sock", Recorder()) as path:
        reply = await one(path, b"GET /tool HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert (reply[0], reply[1]) == (405, "Method Not Allowed")


@pytest.mark.parametrize(
    ("answered", "status", "reason"),
    [(299, 299, "Success"), (451, 451, "Unavailable For Legal Reasons"), (799, 500, "Internal Server Error")],
)
async def test_every_status_goes_out_with_a_reason(
    sock_dir: Path, answered: int, status: int, reason: str
) -> None:
    async with serving(sock_dir / "t.sock", Recorder(answered)) as path:
        reply = await one(path, post(b"{}"))
    assert (reply[0], reply[1]) == (status, reason)


async def test_a_failing_handler_gives_a_500_and_the_server_goes_on(sock_dir: Path) -> None:
    async def broken(route: str, body: bytes) -> tuple[int, bytes]:
        raise RuntimeError("bug")

    async with serving(sock_dir / "t.sock", broken) as path:
        first = await one(path, post(b"{}"))
        second = await one(path, post(b"{}"))
    assert first[0] == second[0] == 500
    assert "RuntimeError" in message(first)


async def test_a_stalled_request_gets_a_408(sock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tool_server, "READ_TIMEOUT_S", 0.2)
    async with serving(sock_dir / "t.sock", Recorder()) as path:
        reply = await one(path, post(b"{}", extra="Content-Length: 10\r\n"))  # 2 of 10 bytes, then nothing
    assert (reply[0], reply[1]) == (408, "Request Timeout")


async def test_the_tool_route_decodes_calls(sock_dir: Path) -> None:
    seen: list[ToolCall] = []

    async def call(request: ToolCall) -> dict[str, object]:
        seen.append(request)
        return {"ok": True, "tool": request.tool}

    async with serving(sock_dir / "t.sock", tool_handler(call)) as path:
        good = await one(path, post(b'{"tool": "get_goal", "context": {"sessionID": "ses_1"}}'))
        bad = await one(path, post(b'{"tool": 3}'))
        elsewhere = await one(path, post(b"{}", route="/other"))
    assert (good[0], json.loads(good[3])) == (200, {"ok": True, "tool": "get_goal"})
    assert seen == [ToolCall(tool="get_goal", context={"sessionID": "ses_1"})]
    assert bad[0] == 400 and "invalid tool call" in message(bad)
    assert elsewhere[0] == 404 and "/other" in message(elsewhere)


# -- the socket and its directory ---------------------------------------------------------------------


async def test_the_socket_is_0600_in_a_0700_directory_and_gone_after(sock_dir: Path) -> None:
    async with serving(sock_dir / "t.sock", Recorder()) as path:
        assert stat.S_IMODE(os.stat(sock_dir).st_mode) == 0o700
        assert stat.S_ISSOCK(os.stat(path).st_mode)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert sorted(os.listdir(sock_dir)) == ["t.sock"]  # the bind-beside name was renamed away
    assert not path.exists()


def test_an_existing_directory_of_ours_is_tightened(sock_dir: Path) -> None:
    sock_dir.mkdir(mode=0o755)
    os.chmod(sock_dir, 0o755)
    private_socket_dir(sock_dir)
    assert stat.S_IMODE(os.stat(sock_dir).st_mode) == 0o700


def test_a_symlinked_directory_is_refused(sock_dir: Path) -> None:
    real = sock_dir.with_name("real")
    real.mkdir(mode=0o700)
    sock_dir.symlink_to(real)
    with pytest.raises(UnsafeDirectoryError, match="not a directory"):
        private_socket_dir(sock_dir)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a directory to another user")
def test_a_directory_of_another_user_is_refused(sock_dir: Path) -> None:
    sock_dir.mkdir(mode=0o700)
    os.chown(sock_dir, 65534, 65534)
    with pytest.raises(UnsafeDirectoryError, match="belongs to uid 65534"):
        private_socket_dir(sock_dir)


async def test_a_new_server_takes_the_path_over_and_the_old_one_leaves_it(sock_dir: Path) -> None:
    old, new = Recorder(), Recorder()
    path = sock_dir / "t.sock"
    async with anyio.create_task_group() as outer:
        async with anyio.create_task_group() as first:
            await first.start(serve, path, TOKEN, old)
            await outer.start(serve, path, TOKEN, new)  # no EADDRINUSE while the old one still listens
            await one(path, post(b"to-new"))
            first.cancel_scope.cancel()
        assert path.exists()  # the old server, stopping, left the new one's socket
        await one(path, post(b"still-new"))
        outer.cancel_scope.cancel()
    assert old.calls == []
    assert [body for _, body in new.calls] == [b"to-new", b"still-new"]


async def test_when_the_new_server_stops_first_the_old_one_is_reachable_again(sock_dir: Path) -> None:
    """A standby engine takes the path over, then stops (removing its socket): the engine still running
    puts its own socket back, so OpenCode's tool calls reach it again."""
    old, new = Recorder(), Recorder()
    path = sock_dir / "t.sock"
    async with anyio.create_task_group() as outer:
        await outer.start(serve, path, TOKEN, old)
        async with anyio.create_task_group() as second:
            await second.start(serve, path, TOKEN, new)
            await one(path, post(b"to-new"))
            second.cancel_scope.cancel()
        await await_until("the old server's socket back at its path", path.exists)
        await one(path, post(b"to-old"))
        outer.cancel_scope.cancel()
    assert not path.exists()  # and the old one, stopping, removed its own
    assert [body for _, body in new.calls] == [b"to-new"]
    assert [body for _, body in old.calls] == [b"to-old"]


# -- whatever arrives, the answer is HTTP with a JSON body --------------------------------------------

_HEADS = st.sampled_from([b"", b"POST /tool HTTP/1.1\r\n", b"POST /tool HTTP/1.1\r\nHost: x\r\n"])


@settings(max_examples=scaled(60))
@given(head=_HEADS, tail=st.binary(max_size=200))
@example(head=b"POST /tool HTTP/1.1\r\nHost: x\r\n", tail=b"Content-Length: 5\r\n\r\nab")
@example(head=b"", tail=b"\r\n")
def test_any_bytes_get_an_http_answer_with_a_json_body(head: bytes, tail: bytes) -> None:
    raw = head + tail

    async def run() -> tuple[list[Reply], Reply]:
        with tempfile.TemporaryDirectory(prefix="ts-") as d:
            async with serving(Path(d) / "run" / "t.sock", Recorder()) as path:
                replies = await exchange(path, raw, eof=True)  # a cut-off request ends there
                after = await one(path, post(b"{}"))  # and the server is still there
        return replies, after

    replies, after = anyio.run(run)
    assert after[0] == 200
    if not replies:
        assert not raw.strip(b"\r\n")  # only nothing at all (or blank lines) goes unanswered
    for status, reason, headers, body in replies:
        assert 200 <= status <= 599 and reason
        assert headers["content-type"] == "application/json"
        assert "ok" in json.loads(body)
