"""The wire to a command's owner (supervisor) process: connect to its socket, ask, read the answer.

The owner serves one JSON request per connection on ``<id>.sock``; whoever connects checks (``SO_PEERCRED``)
that the process serving it is the same user. Requests are a tagged union of Structs (``op`` names the
request) and answers one Struct, both decoded strictly: a malformed request is refused naming the field.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import anyio
import msgspec
from anyio.abc import SocketAttribute
from anyio.streams.buffered import BufferedByteReceiveStream

from ..errors import UsageError
from ..events.base import Caller
from .paths import CommandPaths, ForeignOwnerError, owner_alive, peer_uid

if TYPE_CHECKING:
    from anyio.abc import SocketStream

OWNER_CONNECT_WAIT_S = 10.0
"""How long a request waits for a freshly started owner to open its socket and answer."""
MAX_LINE = 1 << 20


class OwnerRequest(msgspec.Struct, frozen=True, kw_only=True, tag_field="op", forbid_unknown_fields=True):
    """One request to a command's owner; the subclass's tag is its ``op``."""

    called_by: Caller | None = None
    """The OpenCode tool call that asked (``loopd_command_*``): the owner records it on what it appends."""


class Status(OwnerRequest, frozen=True, kw_only=True, tag="status"):
    """The live process: pid, bytes streamed, the watch's state."""


class Refresh(OwnerRequest, frozen=True, kw_only=True, tag="refresh"):
    """Re-read the command's state and awaits from the log (a new await may already match)."""


class Attach(OwnerRequest, frozen=True, kw_only=True, tag="attach"):
    """Turn this connection into a live terminal."""


class Write(OwnerRequest, frozen=True, kw_only=True, tag="write"):
    data: Annotated[str, msgspec.Meta(max_length=MAX_LINE)]
    """The bytes to type, base64."""


class Interrupt(OwnerRequest, frozen=True, kw_only=True, tag="interrupt"):
    pass


class Terminate(OwnerRequest, frozen=True, kw_only=True, tag="terminate"):
    remove: bool = False


class Kill(OwnerRequest, frozen=True, kw_only=True, tag="kill"):
    remove: bool = False


_Size = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31)]  # the sign is checked with the reference's words


class Resize(OwnerRequest, frozen=True, kw_only=True, tag="resize"):
    cols: _Size
    rows: _Size


class Watch(OwnerRequest, frozen=True, kw_only=True, tag="watch"):
    clear: bool = False
    filter: str = ""
    until: str = ""
    ignore_case: bool = False
    until_action: Literal["stop", "keep"] = "stop"


AnyRequest = Status | Refresh | Attach | Write | Interrupt | Terminate | Kill | Resize | Watch


class OwnerAnswer(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The owner's answer: ``ok`` and the reference's message; ``code`` is the exit code of a refusal; the
    rest answers ``status``."""

    ok: bool
    message: str = ""
    code: int | None = None
    status: str | None = None
    pid: int | None = None
    stream_bytes: int | None = None
    output_bytes: int | None = None
    watch_state: str | None = None
    dropped: int | None = None


_REQUEST = msgspec.json.Decoder(AnyRequest)
_ANSWER = msgspec.json.Decoder(OwnerAnswer)


def decode_request(line: bytes) -> AnyRequest:
    """The request on ``line``.

    :raises UsageError: naming the field when it is not one.
    """
    try:
        return _REQUEST.decode(line)
    except msgspec.DecodeError as e:
        raise UsageError(f"bad request: {e}") from None


def encode(message: OwnerRequest | OwnerAnswer) -> bytes:
    """One line of the wire."""
    return msgspec.json.encode(message) + b"\n"


async def connect_owner(sock: Path) -> SocketStream:
    """Connect to an owner's socket and check (``SO_PEERCRED``) that the process serving it is us.

    :raises OSError: when nobody listens; :raises ForeignOwnerError: when another user does.
    """
    stream = await anyio.connect_unix(sock)
    uid = peer_uid(stream.extra(SocketAttribute.raw_socket))
    if uid != os.getuid():
        await stream.aclose()
        raise ForeignOwnerError(sock, uid)
    return stream


async def owner_request(
    paths: CommandPaths, command_id: str, request: OwnerRequest, within: float = OWNER_CONNECT_WAIT_S
) -> OwnerAnswer | None:
    """Send one request to the command's owner and return its answer; ``None`` when no owner answered.

    Waits (at most ``within`` seconds in all) for a freshly started owner to open its socket and answer.
    """
    sock = paths.socket(command_id)
    lock = paths.lock(command_id)
    with anyio.move_on_after(within):
        while True:
            try:
                stream = await connect_owner(sock)
            except OSError:
                if not owner_alive(lock):
                    return None
                await anyio.sleep(0.05)
                continue
            async with stream:
                buffered = BufferedByteReceiveStream(stream)
                try:
                    await stream.send(encode(request))
                    line = await buffered.receive_until(b"\n", MAX_LINE)
                except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError, OSError):
                    return None  # the owner ended while answering (a reset is one way it ends)
                try:
                    return _ANSWER.decode(line)
                except msgspec.DecodeError:
                    return OwnerAnswer(ok=False, message=f"the owner answered something else: {line[:200]!r}")
    return None
