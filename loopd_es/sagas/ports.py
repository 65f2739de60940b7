"""What the sagas need from the application layer, as a protocol: ``app/`` implements it and passes it in.

The sagas drive host calls and record their outcomes, but deciding goal commands and appending with causal
links is the goal service's job (:class:`loopd_es.app.service.GoalService`). Declaring that dependency here
keeps the layers one-way: ``app`` imports ``sagas``, never the reverse.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

import msgspec

from ..events.envelope import ANY, ExpectedVersion, new_event_id

if TYPE_CHECKING:
    from ..domain import goal_commands as c
    from ..domain.state import GoalState
    from ..events.base import Event
    from ..events.envelope import Envelope
    from ..host.base import WorkerHost
    from ..log.base import LogStore


class Ctx(msgspec.Struct, frozen=True):
    """The causal links of what is being written: the flow (correlation) and the direct cause (causation)."""

    correlation_id: str
    causation_id: str

    @classmethod
    def new(cls) -> Ctx:
        """A fresh flow whose root cause is the request itself (both ids the same)."""
        request = new_event_id()
        return cls(request, request)

    def caused_by(self, event_id: str) -> Ctx:
        """The same flow, caused by the event ``event_id``."""
        return Ctx(self.correlation_id, event_id)


class GoalPort(Protocol):
    """The goal service as the sagas use it: the log, the host, the clock, load/decide/append."""

    store: LogStore
    host: WorkerHost
    clock: Callable[[], datetime]

    async def load(self, goal_id: str) -> GoalState:
        """The goal folded from its stream."""
        ...

    async def execute(self, command: c.GoalCommand, ctx: Ctx) -> list[Envelope]:
        """Decide ``command`` on the goal's current version and append the result (re-decided on conflict)."""
        ...

    async def append(
        self, stream: str, events: Sequence[Event], ctx: Ctx, *, expected: ExpectedVersion = ANY
    ) -> list[Envelope]:
        """Append payloads to any stream with the flow's causal links."""
        ...
