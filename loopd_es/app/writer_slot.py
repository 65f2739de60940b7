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

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Final

from ..clock import WALL, Clock
from ..log.coord_hold import coord_hold

if TYPE_CHECKING:
    from ..log.base import LogStore
    from ..log.coord import Fence

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
    busy = "another process has been activating a workspace-writing goal for a while; retry the command"
    async with coord_hold(store, KEY, hold_us=HOLD_US, wait_s=WAIT_S, busy=busy, clock=clock) as fence:
        yield fence
