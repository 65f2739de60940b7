"""Owner notifications through an outbox on stream ``notifications``: recorded once, delivered exactly once.

A notice is recorded as ``notification.requested`` whose event id is derived from its cause and kind, so the
same cause recorded twice (a retry, a restart replaying its reaction) appends nothing. Delivery shows it
through the host under its ``notification_id`` (the host shows an id once) and then records
``notification.delivered``. Undelivered notices are found again at start-up by reading the stream. A notice
whose owner is no session of the host (a goal created from the CLI: owner ``cli``) is recorded
``notification.undeliverable`` instead, once: it is settled, never retried, and read with ``loopd-es
notifications``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final, NamedTuple

from ..app.turns import Guard, no_guard
from ..clock import whole_ms
from ..errors import DuplicateEventIdError
from ..events import notification as n
from ..events.catalogue import decode_payload, new_event
from ..events.envelope import ANY
from ..host.errors import HostError, SessionNotFoundError
from .shares import GoalLostError

if TYPE_CHECKING:
    from ..app.service import Ctx
    from ..clock import Clock
    from ..domain.state import GoalState
    from ..events.envelope import Envelope
    from ..host.events import EngineHost
    from ..log.base import LogStore
    from ..log.coord import Fence

STREAM: Final = n.STREAM
_NAMESPACE: Final = uuid.UUID("5b0c3f1e-7c1d-4c55-9a57-5f0e8b1d2a10")


def notification_event_id(notification_id: str, what: str = "requested") -> str:
    """The event id of a notice's request (or delivery): the same notice always gets the same id."""
    return str(uuid.uuid5(_NAMESPACE, f"{what}:{notification_id}"))


class CommandOwner(NamedTuple):
    """The session that started command ``command_id``: a notice to it names no goal."""

    command_id: str
    owner_session_id: str
    goal_id: str = ""


class Outbox:
    """Records notices and delivers the undelivered ones through the host."""

    def __init__(
        self,
        store: LogStore,
        host: EngineHost,
        clock: Clock,
        guard: Guard | None = None,
        *,
        owns: Callable[[str], bool] | None = None,
        owns_command: Callable[[str], bool] | None = None,
        fence_for: Callable[[str], Sequence[Fence]] | None = None,
    ) -> None:
        self.store = store
        self.fence_for = fence_for or (lambda goal_id: ())
        """The fences a notice about a goal carries (a shared engine: its claim of the goal)."""
        self.owns = owns or (lambda goal_id: True)
        """Which goals' notices this process delivers (a shared engine: the goals it holds)."""
        self.owns_command = owns_command or (lambda command_id: True)
        """Which commands' notices this process delivers (a shared engine: those it is preferred for)."""
        self.host = host
        self.clock = clock
        self.guard = guard or no_guard
        self.pending: dict[str, n.NotificationRequested] = {}
        self.delivered: set[str] = set()
        """Settled notices: shown by the host, or recorded as having no session to be shown in."""

    async def load(self) -> None:
        """Find every requested notice that was not delivered (start-up)."""
        if await self.store.stream_version(STREAM):
            async for env in self.store.read_stream(STREAM):
                self.observe(env)

    def known(self, notification_id: str) -> bool:
        """Whether the notice was recorded already (pending or delivered)."""
        return notification_id in self.pending or notification_id in self.delivered

    def pending_for(self, goal_id: str) -> bool:
        """Whether a notice of the goal waits for delivery."""
        return any(p.goal_id == goal_id for p in self.pending.values())

    def observe(self, env: Envelope) -> None:
        """Keep the pending set in step with the stream (also for notices other processes recorded)."""
        if env.type == "notification.requested":
            payload = decode_payload(env)
            assert isinstance(payload, n.NotificationRequested)
            if payload.notification_id not in self.delivered:
                self.pending.setdefault(payload.notification_id, payload)
        elif env.type in ("notification.delivered", "notification.undeliverable"):
            notification_id = env.data_dict()["notification_id"]
            self.delivered.add(notification_id)
            self.pending.pop(notification_id, None)

    async def request(
        self,
        to: GoalState | CommandOwner,
        kind: n.NotificationKind,
        text: str,
        cause_event_id: str,
        ctx: Ctx,
    ) -> str:
        """Record the notice ``kind`` caused by ``cause_event_id`` (once) and deliver it; returns its id.

        ``to`` is the goal whose owner is told, or a command's owner session (the notice names no goal).
        """
        command_id = to.command_id if isinstance(to, CommandOwner) else ""
        return await self._record(to, command_id, kind, text, cause_event_id, ctx)

    async def _record(
        self,
        to: GoalState | CommandOwner,
        command_id: str,
        kind: n.NotificationKind,
        text: str,
        cause_event_id: str,
        ctx: Ctx,
    ) -> str:
        notification_id = f"{cause_event_id}:{kind}"
        payload = n.NotificationRequested(
            notification_id=notification_id,
            goal_id=to.goal_id,
            owner_session_id=to.owner_session_id,
            kind=kind,
            text=text,
            cause_event_id=cause_event_id,
            at=whole_ms(self.clock.now()),
            command_id=command_id,
        )
        event = new_event(
            payload,
            event_id=notification_event_id(notification_id),
            causation_id=cause_event_id,
            correlation_id=ctx.correlation_id,
        )
        try:
            await self.store.append(STREAM, [event], ANY, fences=self._fences(payload))
        except DuplicateEventIdError:
            return notification_id  # recorded before (its text may have named another moment): nothing new
        if notification_id not in self.delivered:
            self.pending.setdefault(notification_id, payload)
        await self.deliver()
        return notification_id

    async def deliver(self) -> int:
        """Show every pending notice through the host and record it delivered; returns how many were shown."""
        shown = 0
        for notification_id, payload in list(self.pending.items()):
            if not payload.goal_id and payload.command_id:
                if self.owns_command(payload.command_id):
                    shown += await self._deliver(notification_id, payload)
                continue
            if not self.owns(payload.goal_id):
                continue
            try:
                shown += await self._deliver(notification_id, payload)
            except GoalLostError:
                continue  # a shared engine lost the goal meanwhile: its new holder delivers
        return shown

    def _fences(self, payload: n.NotificationRequested) -> Sequence[Fence]:
        """The fences of a write about ``payload``: its goal's, or none for a command's notice."""
        return self.fence_for(payload.goal_id) if payload.goal_id else ()

    async def _deliver(self, notification_id: str, payload: n.NotificationRequested) -> int:
        """Show one notice and record it delivered; 0 when the host failed it (it stays pending) or had it."""
        await self.guard(payload.goal_id or None)
        try:
            shown = int(
                await self.host.notify(
                    payload.owner_session_id, payload.text, notification_id=notification_id
                )
            )
        except SessionNotFoundError as e:  # no session to show it in: retrying would fail the same way
            gone = n.NotificationUndeliverable(
                notification_id=notification_id,
                goal_id=payload.goal_id,
                reason=f"{payload.owner_session_id!r} is not a session of the host ({e.reason})",
                at=whole_ms(self.clock.now()),
                command_id=payload.command_id,
            )
            await self._settle(notification_id, payload, gone, "undeliverable")
            return 0
        except HostError:
            return 0  # stays pending: the next delivery pass tries again
        done = n.NotificationDelivered(
            notification_id=notification_id,
            goal_id=payload.goal_id,
            at=whole_ms(self.clock.now()),
            command_id=payload.command_id,
        )
        await self._settle(notification_id, payload, done, "delivered")
        return shown

    async def _settle(
        self,
        notification_id: str,
        payload: n.NotificationRequested,
        fact: n.NotificationDelivered | n.NotificationUndeliverable,
        what: str,
    ) -> None:
        """Record the notice delivered (or undeliverable), once whoever records it, and stop retrying it."""
        try:
            await self.store.append(
                STREAM,
                [
                    new_event(
                        fact,
                        event_id=notification_event_id(notification_id, what),
                        causation_id=notification_event_id(notification_id),
                    )
                ],
                ANY,
                fences=self._fences(payload),
            )
        except DuplicateEventIdError:
            pass  # another process (an engine, a CLI operation) recorded the same outcome first
        self.pending.pop(notification_id, None)
        self.delivered.add(notification_id)
