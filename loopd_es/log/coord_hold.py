"""A short hold on one coordination record: the way to make a check-then-append atomic across processes.

Some decisions read more than one stream and must not race another process's same decision: only one
workspace writer may be activated, only ``max_tasks`` live ``/loop`` tasks may exist. The process takes the
record (compare-and-set, token up by one), reads and decides, appends fenced on its token, and gives it back.
The next taker then reads a log that already holds the first decision. A holder that crashed is taken over
once its record runs out, and its token fences off anything it might still write. Nothing of it is an event.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Final

import anyio

from ..clock import WALL, Clock, to_us
from ..errors import ConflictError, LoopdError
from .coord import Claim, Fence

if TYPE_CHECKING:
    from .base import LogStore

log = logging.getLogger("loopd_es.log")


@asynccontextmanager
async def coord_hold(
    store: LogStore, key: str, *, hold_us: int, wait_s: float, busy: str, clock: Clock = WALL
) -> AsyncIterator[Fence]:
    """Hold ``key`` for at most ``hold_us`` without renewal; yields the fence the decided append must carry.

    Released on exit, also on error or cancellation.

    :raises ConflictError: ``busy``, when another process held the record for ``wait_s`` seconds.
    :raises StorageError: when the store cannot be read or written (a locked log: its own timeout).
    """
    holder = f"hold-{uuid.uuid4()}"
    deadline = time.monotonic() + wait_s
    while True:  # the store's own waits (a locked log) end in its own errors: only a live holder is "busy"
        found = next((c for c in await store.coord_read(key) if c.key == key), None)
        token = found.token if found is not None else 0
        now = to_us(clock.now())
        if found is None or not found.live(now):
            mine = Claim(key=key, holder=holder, token=token + 1, expires_us=now + hold_us)
            if await store.coord_swap(key, token, mine) is None:
                break
        elif time.monotonic() >= deadline:
            raise ConflictError(busy)
        await anyio.sleep(0.05)
    taken = token + 1
    try:
        yield Fence(key, taken)
    finally:  # best effort: a release that cannot land now runs out by itself within hold_us
        with anyio.CancelScope(shield=True), anyio.move_on_after(RELEASE_S):
            try:
                await store.coord_swap(key, taken, Claim(key=key, holder="", token=taken, expires_us=0))
            except LoopdError as e:  # the decided write landed: its caller must hear that, not this
                log.info("%s: could not release %s (%s); it runs out by itself", store.url, key, e)


RELEASE_S: Final = 2.0
"""How long giving a hold back may take (shielded: a SIGTERM waits for it) before it is left to run out."""
