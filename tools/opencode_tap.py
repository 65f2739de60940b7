"""A TCP relay between ``loopd-es run`` and ``opencode serve`` that notes when each turn's edges cross it.

    python tools/opencode_tap.py LISTEN_PORT UPSTREAM_PORT OUT_FILE

``tools/bench_opencode.py`` points the engine at it to measure the engine's overhead per turn where the issue
defines it, at the engine's own socket: from the turn's idle (the first of ``session.status`` idle / ``session.idle``) reaching the engine on ``/event`` to the engine's
next ``POST /session/{id}/prompt_async`` leaving it. It writes one line per edge, ``<unix time> idle|prompt
<session id>``, stamped as the bytes are read, before they are passed on; it runs in a process of its own so
neither the benchmark's nor the engine's work delays a stamp. The relay hop (two socket copies on loopback) is
inside the measured interval, so the figure errs high, not low.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from typing import TextIO

IDLE = re.compile(
    rb'"type":"session\.(?:idle|status)","properties":\{"sessionID":"(ses_[A-Za-z0-9]+)"(?:\}|,"status":\{"type":"idle")'
)
"""Either half of OpenCode's idle pair (a status of ``idle``, then ``session.idle``): the engine acts on the first."""
PROMPT = re.compile(rb"POST /session/(ses_[A-Za-z0-9]+)/prompt_async ")
OVERLAP = 256
"""Bytes of the previous read searched again, so an edge split across two reads is still seen (once)."""


async def _pipe(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    edge: re.Pattern[bytes],
    name: str,
    out: TextIO,
) -> None:
    tail = b""
    try:
        while chunk := await reader.read(65536):
            stamp = time.time()
            seen = tail + chunk
            for match in edge.finditer(seen):
                if match.end() > len(tail):  # not already seen in the previous read
                    out.write(f"{stamp:.6f} {name} {match.group(1).decode()}\n")
            tail = seen[-OVERLAP:]
            writer.write(chunk)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def main(listen: int, upstream: int, out: TextIO) -> None:
    async def relay(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection("127.0.0.1", upstream)
        await asyncio.gather(
            _pipe(client_r, server_w, PROMPT, "prompt", out),
            _pipe(server_r, client_w, IDLE, "idle", out),
        )

    server = await asyncio.start_server(relay, "127.0.0.1", listen)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    with open(sys.argv[3], "a", buffering=1) as notes:  # one line per edge, written as it is seen
        asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), notes))
