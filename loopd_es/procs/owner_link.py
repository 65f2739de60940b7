"""The wire to a command's owner (supervisor) process: connect to its socket, ask, read the answer.

The owner serves one JSON request per connection on ``<id>.sock``; whoever connects checks (``SO_PEERCRED``)
that the process serving it is the same user.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import SocketAttribute
from anyio.streams.buffered import BufferedByteReceiveStream

from .paths import CommandPaths, ForeignOwnerError, owner_alive, peer_uid

if TYPE_CHECKING:
    from anyio.abc import SocketStream

OWNER_CONNECT_WAIT_S = 10.0
"""How long a request waits for a freshly started owner to open its socket and answer."""


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
    paths: CommandPaths, command_id: str, request: dict[str, Any], within: float = OWNER_CONNECT_WAIT_S
) -> dict[str, Any] | None:
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
                await stream.send(json.dumps(request).encode() + b"\n")
                buffered = BufferedByteReceiveStream(stream)
                try:
                    line = await buffered.receive_until(b"\n", 1 << 20)
                except (anyio.EndOfStream, anyio.IncompleteRead, OSError):
                    return None  # the owner ended while answering
                answer: dict[str, Any] = json.loads(line)
                return answer
    return None
