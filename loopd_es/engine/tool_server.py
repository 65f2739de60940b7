"""The tool channel's server: HTTP/1.1 (h11) on a Unix socket in a directory only this user can enter.

A fixed loopback port can be bound first by any local user, who then receives every call and its token; a
socket file in a 0700 directory of ours cannot be replaced or reached by anyone else, and OpenCode's Bun
``fetch`` reaches it with its ``unix`` option. The server knows nothing about tools: it checks the bearer
token and hands ``(route, body)`` of each ``POST`` to a :data:`Handler`, whose ``(status, JSON bytes)`` it
sends back. Every refusal is an HTTP answer with a JSON ``{"ok": false, "message": ...}`` body: malformed
requests get 400, a body over :data:`MAX_BODY` 413, a request that stalls 408.

A new server takes the path over from an old one still listening (it binds beside it and renames over it), so a
standby taking the lease never fails on a busy address, and the old one, closing, leaves the new socket alone;
when the new one stops first, the old one puts its own socket back.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import os
import stat
import tempfile
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from pathlib import Path
from typing import Final

import anyio
import anyio.abc
import h11

from ..errors import StorageError
from ..procs.paths import UnsafeDirectoryError, check_private

log = logging.getLogger("loopd_es.engine.tools")

Handler = Callable[[str, bytes], Awaitable[tuple[int, bytes]]]
"""``(route, body) -> (status, JSON body)``: what the engine answers a ``POST`` with a valid token."""

MAX_BODY: Final = 1 << 20
MAX_HEAD: Final = 16 << 10
READ_TIMEOUT_S: Final = 10.0
MAX_SOCKET_PATH: Final = 100  # sun_path is 108 bytes on Linux, 104 on macOS
_WHAT: Final = "the OpenCode tool socket"
_CLASSES: Final = {2: "Success", 3: "Redirection", 4: "Client Error", 5: "Server Error"}


class SocketPathError(StorageError):
    """Raised when the tool socket cannot be placed: its path is too long for a Unix socket."""


def socket_dir() -> Path:
    """Where tool sockets live: ``$XDG_RUNTIME_DIR/loopd-es`` (made 0700 by the login manager's parent), else
    ``$TMPDIR/loopd-es-<uid>`` (the directory command sockets use)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_absolute() and Path(runtime).is_dir():
        return Path(runtime) / "loopd-es"
    return Path(tempfile.gettempdir()) / f"loopd-es-{os.getuid()}"


def socket_path(name: str) -> Path:
    """``name`` in :func:`socket_dir`.

    :raises SocketPathError: when the path is too long for a Unix socket.
    """
    path = socket_dir() / name
    _check_length(path)
    return path


def check_socket_path(path: Path) -> None:
    """A tool socket may go at ``path``: short enough for a Unix socket, and nothing but a socket is there.

    :raises SocketPathError: saying what to do (a hand-edited config can name any path; a file there is the
        user's, and is never removed to make room).
    """
    _check_length(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):  # the path is fixed per project: installing again names it again
        raise SocketPathError(
            f"cannot serve the OpenCode tools at {path}: something that is not a socket is there; move it away"
        )


def _check_length(path: Path) -> None:
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise SocketPathError(
            f"the tool socket path {str(path)!r} is longer than {MAX_SOCKET_PATH} bytes; "
            "set XDG_RUNTIME_DIR or TMPDIR to a shorter directory and run `loopd-es opencode install` again"
        )


def private_socket_dir(path: Path) -> Path:
    """Create ``path`` 0700 or make sure it is a real directory of ours; an existing one is tightened to 0700.

    :raises UnsafeDirectoryError: when it is not a directory, or belongs to someone else.
    """
    try:
        path.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        pass
    except OSError as e:
        raise UnsafeDirectoryError(path, f"it cannot be created ({e.strerror})", _WHAT) from e
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and st.st_mode & 0o077:
        os.chmod(path, 0o700)  # ours but readable by others (an older version's, or a umask's)
    check_private(path, _WHAT)
    return path


async def serve(
    path: Path,
    token: str,
    handler: Handler,
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Answer ``POST`` requests carrying ``token`` on the Unix socket ``path`` until cancelled.

    Started (``task_status``) once the socket is at ``path`` and accepting. While serving, a socket that
    disappears from ``path`` is put back within :data:`REBIND_CHECK_S`: when a newer server (a standby engine)
    took the path over and then stopped, it removed its socket, and the engine still running must be reachable
    again.

    :raises UnsafeDirectoryError: when the socket's directory is not private to this user.
    """
    ours: set[int] = set()
    try:
        async with anyio.create_task_group() as tg:
            await _bind(tg, path, token, handler, ours)
            task_status.started()
            while True:
                await anyio.sleep(REBIND_CHECK_S)
                try:
                    os.lstat(path)
                except FileNotFoundError:
                    log.info("%s: the tool socket is gone (a newer server stopped); serving it again", path)
                    await _bind(tg, path, token, handler, ours)
    finally:
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino in ours:  # a newer server's socket stays
                os.unlink(path)


REBIND_CHECK_S: Final = 1.0
"""How often a serving engine looks whether its socket is still at its path."""


async def _bind(tg: anyio.abc.TaskGroup, path: Path, token: str, handler: Handler, ours: set[int]) -> None:
    """Listen on a socket beside ``path`` and rename it over ``path`` (atomic: a client finds the old server's
    socket or ours, never nothing); serve it in ``tg``."""
    private_socket_dir(path.parent)
    check_socket_path(path)
    bound = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        listener = await anyio.create_unix_listener(bound, mode=0o600)
    except OSError as e:
        raise StorageError(f"cannot serve the OpenCode tools at {path}: {e.strerror or e}") from e
    try:
        os.replace(bound, path)
        ours.add(os.stat(path).st_ino)
    except BaseException as e:
        await listener.aclose()
        with contextlib.suppress(OSError):
            os.unlink(bound)
        if isinstance(e, OSError):
            raise StorageError(
                f"cannot serve the OpenCode tools at {path}: {e.strerror}; remove what is there, or run "
                "`loopd-es opencode install` again"
            ) from e
        raise
    tg.start_soon(_listen, listener, token, handler)


async def _listen(listener: anyio.abc.Listener[anyio.abc.SocketStream], token: str, handler: Handler) -> None:
    async with listener:
        await listener.serve(lambda stream: _connection(stream, token.encode(), handler))


class _Refusal(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def _connection(stream: anyio.abc.ByteStream, token: bytes, handler: Handler) -> None:
    """Serve one connection's requests in turn (Bun keeps connections alive) until either side closes."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
    async with stream:
        while True:
            try:
                with anyio.fail_after(READ_TIMEOUT_S):
                    request = await _read(conn, stream)
                if request is None:
                    return
                status, answer = await _answer(*request, token, handler)
            except h11.RemoteProtocolError as e:
                status, answer = e.error_status_hint, _error(f"malformed request: {e}")
            except _Refusal as e:
                status, answer = e.status, _error(str(e))
            except TimeoutError:
                if conn.their_state is h11.IDLE and not conn.trailing_data[0]:
                    return  # an idle kept-alive connection: close it quietly
                status, answer = 408, _error(f"request not received within {READ_TIMEOUT_S:g}s")
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                return
            if not await _send(conn, stream, status, answer):
                return
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return
            conn.start_next_cycle()


async def _read(conn: h11.Connection, stream: anyio.abc.ByteStream) -> tuple[h11.Request, bytes] | None:
    """The next request and its whole body; ``None`` when the client closed between requests."""
    request = await _event(conn, stream)
    if isinstance(request, h11.ConnectionClosed):
        return None
    assert isinstance(request, h11.Request)
    for name, value in request.headers:
        if name == b"content-length" and int(value) > MAX_BODY:  # h11 has checked it is digits
            raise _Refusal(413, f"a body of {int(value)} bytes is over the limit of {MAX_BODY}")
    body = bytearray()
    while True:
        event = await _event(conn, stream)
        if isinstance(event, h11.Data):
            body += event.data
            if len(body) > MAX_BODY:
                raise _Refusal(413, f"the body is over the limit of {MAX_BODY} bytes")
        elif isinstance(event, h11.EndOfMessage):
            return request, bytes(body)


async def _event(conn: h11.Connection, stream: anyio.abc.ByteStream) -> h11.Event:
    """The next event of the request, reading (and answering ``Expect: 100-continue``) as needed."""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            if conn.they_are_waiting_for_100_continue:
                await stream.send(conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b"")
            try:
                data = await stream.receive(65536)
            except anyio.EndOfStream:
                data = b""
            conn.receive_data(data)
        elif event is h11.PAUSED:  # only after a response ends a cycle, which _connection never reads past
            raise _Refusal(400, "request after the end of the connection")
        else:
            assert isinstance(event, h11.Event)
            return event


async def _answer(request: h11.Request, body: bytes, token: bytes, handler: Handler) -> tuple[int, bytes]:
    """Check the method and token, then ask the handler; a handler that fails or misbehaves gives a 500."""
    if request.method != b"POST":
        raise _Refusal(405, f"{request.method.decode('latin-1')} is not allowed: POST only")
    given = b""
    for name, value in request.headers:
        if name == b"authorization" and value.startswith(b"Bearer "):
            given = value.removeprefix(b"Bearer ").strip()
    if not hmac.compare_digest(given, token):
        raise _Refusal(401, "bad or missing token: run `loopd-es opencode install` again")
    route = request.target.decode("latin-1").split("?", 1)[0]
    try:
        status, answer = await handler(route, body)
    except Exception as e:  # a bug must not take the engine down: the caller gets a one-line answer
        log.exception("tool request %s failed", route)
        return 500, _error(f"internal error in the engine ({type(e).__name__}); see its log")
    if not 200 <= status <= 599:
        log.error("tool handler answered %s with status %d", route, status)
        return 500, _error(f"internal error in the engine (status {status}); see its log")
    return status, answer


async def _send(conn: h11.Connection, stream: anyio.abc.ByteStream, status: int, body: bytes) -> bool:
    """Send one response (closing after an error); ``False`` when it could not be sent."""
    if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
        return False
    headers = [("content-type", "application/json"), ("content-length", str(len(body)))]
    if status >= 400:
        headers.append(("connection", "close"))
    data = conn.send(h11.Response(status_code=status, headers=headers, reason=_reason(status)))
    data = (data or b"") + (conn.send(h11.Data(data=body)) or b"") + (conn.send(h11.EndOfMessage()) or b"")
    with anyio.move_on_after(READ_TIMEOUT_S) as scope:
        try:
            await stream.send(data)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            return False
    return not scope.cancelled_caught


def _reason(status: int) -> bytes:
    """The standard reason phrase, or the status class's name for a code without one (299: Success)."""
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return _CLASSES.get(status // 100, "Unknown").encode()


def _error(message: str) -> bytes:
    return json.dumps({"ok": False, "message": message}).encode()
