"""What the host contract needs besides the host: a worker that takes turns of a given kind, and an event recorder.

A real host's worker acts on its own (OpenCode's model answers, calls a tool, hits a rate limit); the
simulated host's worker acts when told (:meth:`~loopd_es.host.simulated.SimulatedHost.reply` ...). A
:class:`ContractWorker` hides the difference: ``turn(kind)`` sends the prompt and gets that kind of turn from
whichever worker there is. :class:`SimulatedWorker` is the one for the simulated host.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, Protocol

import anyio

from ..host.events import AnyHostEvent, EngineHost, MessageUpdated, SessionIdle, SessionStatusChanged
from ..host.simulated import SimulatedHost

if TYPE_CHECKING:
    from ..host.base import PromptReceipt

TurnKind = Literal["answer", "tool", "slow", "rate-limit", "error"]
"""``answer``: a text answer with usage, then idle. ``tool``: one tool call, then a text answer (two assistant
messages answering the prompt). ``slow``: the worker keeps working until aborted. ``rate-limit``: the provider
refuses with 429, the host retries (``retry`` status), then reports the error and goes idle. ``error``: a
provider error the host does not retry (400), then idle."""


class ContractWorker(Protocol):
    """A host's worker as the contract drives it."""

    models: tuple[str, str]
    """Two models usable on the host (``providerID/modelID``): the usual one and another to switch to."""
    agents: tuple[str, str]
    """Two agents the host offers."""

    async def turn(
        self,
        host: EngineHost,
        session_id: str,
        kind: TurnKind,
        *,
        prompt_id: str,
        model: str | None = None,
        agent: str | None = None,
    ) -> PromptReceipt:
        """Send a prompt to ``session_id`` and have the worker take a turn of ``kind``."""
        ...

    async def probe(self, host: EngineHost, session_id: str) -> None:
        """Make the host emit at least one event about ``session_id`` (proves the event stream is live)."""
        ...


def new_prompt_id() -> str:
    """A client-chosen prompt id of the shape OpenCode accepts (``msg`` + hex)."""
    return f"msg_{uuid.uuid4().hex}"


def is_idle(event: AnyHostEvent, session_id: str) -> bool:
    """Whether ``event`` is an idle signal of ``session_id`` (``session.idle`` or an ``idle`` status)."""
    if event.session_id != session_id:
        return False
    return isinstance(event, SessionIdle) or (
        isinstance(event, SessionStatusChanged) and event.status == "idle"
    )


class SimulatedWorker:
    """The simulated host's worker: each kind of turn played with the host's worker controls."""

    def __init__(self, models: tuple[str, str], agents: tuple[str, str]) -> None:
        self.models = models
        self.agents = agents

    async def turn(
        self,
        host: EngineHost,
        session_id: str,
        kind: TurnKind,
        *,
        prompt_id: str,
        model: str | None = None,
        agent: str | None = None,
    ) -> PromptReceipt:
        sim = _simulated(host)
        text = 'CALL bash {"command": "echo hi"}' if kind == "tool" else f"a {kind} turn"
        receipt = await host.prompt(session_id, text, model=model, agent=agent, prompt_id=prompt_id)
        if kind == "answer":
            await sim.reply(session_id, text="done")
        elif kind == "tool":
            await sim.reply(session_id, idle=False, text="")
            call = f"call_{uuid.uuid4().hex[:8]}"
            await sim.tool_call(session_id, call)
            await sim.tool_call(session_id, call, done=True)
            await sim.reply(session_id, text="hi")
        elif kind == "rate-limit":
            await sim.go_busy(session_id, "retry")
            error = {"statusCode": 429, "message": "Rate limit exceeded", "code": "rate_limit_exceeded"}
            await sim.fail(session_id, {**error, "responseHeaders": {"retry-after": "1"}})
        elif kind == "error":
            await sim.fail(
                session_id, {"statusCode": 400, "message": "Bad request", "code": "invalid_request_error"}
            )
        return receipt  # "slow": busy until aborted, as a prompt leaves it

    async def probe(self, host: EngineHost, session_id: str) -> None:
        await _simulated(host).user_message(session_id, f"probe_{uuid.uuid4().hex}")


def _simulated(host: EngineHost) -> SimulatedHost:
    inner = getattr(host, "inner", host)  # a HeldHost in front of it
    assert isinstance(inner, SimulatedHost), f"SimulatedWorker drives a simulated host, not {host.url}"
    return inner


class Recorder:
    """Keeps the events a host emits (from :meth:`run` on); :meth:`wait` returns the first that matches."""

    def __init__(self) -> None:
        self.events: list[AnyHostEvent] = []
        self._changed = anyio.Event()

    async def run(self, host: EngineHost) -> None:
        """Read the host's events until cancelled."""
        async for event in host.events():
            self.events.append(event)
            self._changed.set()
            self._changed = anyio.Event()

    async def wait(
        self, match: Callable[[AnyHostEvent], bool], *, after: int = 0, within: float = 30.0
    ) -> AnyHostEvent:
        """The first event (from index ``after``) that ``match``es, waiting up to ``within`` seconds for it."""
        with anyio.fail_after(within):
            while True:
                found = next((e for e in self.events[after:] if match(e)), None)
                if found is not None:
                    return found
                await self._changed.wait()

    async def live(self, host: EngineHost, worker: ContractWorker, session_id: str) -> None:
        """Return once the stream delivers: probe until an event about ``session_id`` arrives."""
        with anyio.fail_after(60):
            while True:
                start = len(self.events)
                await worker.probe(host, session_id)
                with anyio.move_on_after(1.0):
                    await self.wait(
                        lambda e: isinstance(e, MessageUpdated) and e.session_id == session_id, after=start
                    )
                    return
