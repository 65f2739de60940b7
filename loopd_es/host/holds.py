"""Holding host calls: any call of the port can be stopped at its start until someone releases it.

Races between the engine, the CLI and a worker (a turn asked for while a switch is in flight, a SIGTERM while
a /loop prompt is on its way) depend on when a host call runs. A hold makes that moment reproducible: arm a
hold on a call name, wait until a call is held there (:meth:`Holds.wait_held`), act, then :meth:`Holds.release`.

- :class:`Holds` is the in-process hold point (anyio events): :class:`HeldHost` puts it in front of any host
  (OpenCode's too), for tests in one process.
- The simulated host keeps its holds in its state file instead, so ``loopd-es host hold|held|release`` in
  another process controls the calls of a running engine (:mod:`loopd_es.host.simulated`).

A held call has not reached the host yet: cancelling it (a SIGTERM's cancel scope) leaves the host untouched.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Final, get_args

import anyio

from .sim_script import Operation

if TYPE_CHECKING:
    from .base import (
        AgentCatalog,
        ForkedWorker,
        ModelCatalog,
        PromptReceipt,
        SessionIdentity,
        SessionStatus,
        SwitchResult,
    )
    from .events import AnyHostEvent, EngineHost, TranscriptMessage

HOLDABLE: Final = (*get_args(Operation), "fork_worker", "messages", "notify")
"""The calls a hold can stop: every call of :class:`~loopd_es.host.events.EngineHost` but the event stream."""


def check_calls(calls: list[str] | tuple[str, ...], where: str) -> tuple[str, ...]:
    """``calls`` when every one names a holdable call.

    :raises HostConfigError: naming the first unknown call and the known ones.
    """
    from .errors import HostConfigError

    for call in calls:
        if call not in HOLDABLE:
            raise HostConfigError(where, f"cannot hold {call!r}; holdable calls: {', '.join(HOLDABLE)}")
    return tuple(calls)


class Holds:
    """In-process hold points keyed by call name; use from the event loop that runs the held calls."""

    def __init__(self, *calls: str) -> None:
        self._armed: set[str] = set(check_calls(calls, "holds"))
        self._waiting: dict[str, int] = {}
        self._changed = anyio.Event()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def hold(self, *calls: str) -> None:
        """From now on, calls named in ``calls`` wait at their start until released."""
        self._armed.update(check_calls(calls, "holds"))

    def release(self, *calls: str) -> None:
        """Let the held calls of ``calls`` (every call when none is named) go on, and hold no more of them."""
        for call in calls or tuple(self._armed):
            self._armed.discard(call)
        self._notify()

    def held(self, call: str) -> int:
        """How many calls of ``call`` are waiting now."""
        return self._waiting.get(call, 0)

    async def wait_held(self, call: str, *, count: int = 1) -> None:
        """Return once ``count`` calls of ``call`` are waiting (the caller bounds it with a timeout)."""
        while self.held(call) < count:
            await self._changed.wait()

    async def enter(self, call: str) -> None:
        """The hold point: returns at once unless ``call`` is held, else when it is released."""
        if call not in self._armed:
            return
        self._waiting[call] = self._waiting.get(call, 0) + 1
        self._notify()
        try:
            while call in self._armed:
                await self._changed.wait()
        finally:
            self._waiting[call] -= 1


class HeldHost:
    """Any :class:`~loopd_es.host.events.EngineHost` with a :class:`Holds` in front of every call."""

    def __init__(self, inner: EngineHost, holds: Holds | None = None) -> None:
        self.inner = inner
        self.holds = holds or Holds()

    @property
    def url(self) -> str:
        return self.inner.url

    def __getattr__(self, name: str) -> Any:  # the inner host's own controls (a simulated host's reply...)
        return getattr(self.inner, name)

    async def create_worker(
        self, *, title: str, model: str | None = None, agent: str | None = None
    ) -> SessionIdentity:
        await self.holds.enter("create_worker")
        return await self.inner.create_worker(title=title, model=model, agent=agent)

    async def prompt(
        self,
        session_id: str,
        text: str,
        *,
        model: str | None = None,
        agent: str | None = None,
        prompt_id: str | None = None,
        fresh: bool = False,
    ) -> PromptReceipt:
        await self.holds.enter("prompt")
        return await self.inner.prompt(
            session_id, text, model=model, agent=agent, prompt_id=prompt_id, fresh=fresh
        )

    async def session_status(self, session_id: str) -> SessionStatus:
        await self.holds.enter("session_status")
        return await self.inner.session_status(session_id)

    async def abort(self, session_id: str) -> None:
        await self.holds.enter("abort")
        await self.inner.abort(session_id)

    async def session_identity(self, session_id: str) -> SessionIdentity:
        await self.holds.enter("session_identity")
        return await self.inner.session_identity(session_id)

    async def list_models(self) -> ModelCatalog:
        await self.holds.enter("list_models")
        return await self.inner.list_models()

    async def list_agents(self) -> AgentCatalog:
        await self.holds.enter("list_agents")
        return await self.inner.list_agents()

    async def switch_model(self, session_id: str, model: str) -> SwitchResult:
        await self.holds.enter("switch_model")
        return await self.inner.switch_model(session_id, model)

    async def switch_agent(self, session_id: str, agent: str) -> SwitchResult:
        await self.holds.enter("switch_agent")
        return await self.inner.switch_agent(session_id, agent)

    async def compact(self, session_id: str, *, model: str | None = None) -> None:
        await self.holds.enter("compact")
        await self.inner.compact(session_id, model=model)

    async def fork_worker(self, session_id: str, *, through: str | None, title: str) -> ForkedWorker:
        await self.holds.enter("fork_worker")
        return await self.inner.fork_worker(session_id, through=through, title=title)

    async def messages(self, session_id: str, *, limit: int = 200) -> list[TranscriptMessage]:
        await self.holds.enter("messages")
        return await self.inner.messages(session_id, limit=limit)

    def streamed_messages(self, session_id: str, *, limit: int) -> list[TranscriptMessage] | None:
        return self.inner.streamed_messages(session_id, limit=limit)

    async def notify(self, session_id: str, text: str, *, notification_id: str) -> bool:
        await self.holds.enter("notify")
        return await self.inner.notify(session_id, text, notification_id=notification_id)

    async def events(self) -> AsyncIterator[AnyHostEvent]:
        async for event in self.inner.events():
            yield event

    async def aclose(self) -> None:
        await self.inner.aclose()
