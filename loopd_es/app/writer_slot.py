"""The single-writer rule across processes: a short lease beside the log, held while a writer is activated.

Each process checks the active writers, then appends to its own goal's stream; two processes (two machines on
one log, or two project directories) could both see the slot free and both land. A process about to activate
a workspace-writing goal therefore takes the ``goals/writer-slot`` coordination record first
(:meth:`~loopd_es.log.base.LogStore.coord_swap`), reads the writers and decides under it, and appends fenced on
its token: the next one to take the record reads a log that already holds the first writer. Coordination,
not history: nothing of it is an event. A holder that crashed is taken over once its record runs out, and its
token fences off anything it might still try to write.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Final

import anyio

from ..clock import WALL, Clock, to_us
from ..errors import ConflictError
from ..log.coord import Claim, Fence

if TYPE_CHECKING:
    from ..log.base import LogStore

KEY: Final = "goals/writer-slot"
HOLD_US: Final = 15_000_000
"""How long a taken slot holds without its holder: a decision reads the host's catalogs, seconds at worst."""
WAIT_S: Final = 20.0
"""How long a process waits for another's activation to end before it gives up (exit 3)."""


@asynccontextmanager
async def writer_slot(store: LogStore, clock: Clock = WALL) -> AsyncIterator[Fence]:
    """Hold the writer slot; yields the fence the activation's append must carry. Released on exit.

    :raises ConflictError: when another process held it for :data:`WAIT_S`.
    """
    holder = f"writer-{uuid.uuid4()}"
    taken = 0
    with anyio.move_on_after(WAIT_S):
        while not taken:
            found = next((c for c in await store.coord_read(KEY) if c.key == KEY), None)
            token = found.token if found is not None else 0
            now = to_us(clock.now())
            if found is None or not found.live(now):
                mine = Claim(key=KEY, holder=holder, token=token + 1, expires_us=now + HOLD_US)
                if await store.coord_swap(KEY, token, mine) is None:
                    taken = token + 1
                    break
            await anyio.sleep(0.05)
    if not taken:
        raise ConflictError(
            "another process has been activating a workspace-writing goal for a while; retry the command"
        )
    try:
        yield Fence(KEY, taken)
    finally:
        with anyio.CancelScope(shield=True):  # a release that lost the record (taken over) changes nothing
            await store.coord_swap(KEY, taken, Claim(key=KEY, holder="", token=taken, expires_us=0))
