"""A world for saga tests: a SQLite log, the simulated host (in memory), a settable clock, the goal use cases."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loopd_es.app.goals import Goals
from loopd_es.app.service import Ctx, GoalService
from loopd_es.clock import FakeClock
from loopd_es.domain.evolve import fold, initial
from loopd_es.domain.streams import goal_stream
from loopd_es.host.sim_script import HostScript, ScriptAgent, ScriptModel
from loopd_es.host.simulated import SimulatedHost
from loopd_es.log import LogStore, open_store

if TYPE_CHECKING:
    from loopd_es.domain.state import GoalState
    from loopd_es.events.envelope import Envelope

T0 = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)

SCRIPT = HostScript(
    models=tuple(ScriptModel(provider="p", id=m) for m in ("old", "new", "last")),
    agents=tuple(ScriptAgent(name=a) for a in ("old", "new", "last")),
)


@dataclass
class World:
    store: LogStore
    host: SimulatedHost
    clock: FakeClock
    goals: Goals

    @property
    def service(self) -> GoalService:
        return self.goals.service

    def fresh(self) -> Goals:
        """A new service instance on the same log and host: nothing cached (a restart)."""
        return Goals(GoalService(self.store, self.host, clock=self.clock))

    async def state(self, goal_id: str) -> GoalState:
        return await self.service.load(goal_id)

    async def replayed(self, goal_id: str) -> GoalState:
        """The goal folded from scratch, bypassing every cache."""
        events = [e async for e in self.store.read_stream(goal_stream(goal_id))]
        return fold(events, initial(goal_id))

    async def events(self, stream: str | None = None) -> list[Envelope]:
        return [e async for e in self.store.read_all() if stream is None or e.stream == stream]

    async def types(self, goal_id: str) -> list[str]:
        return [e.type for e in await self.events(goal_stream(goal_id))]

    async def switch_calls(self) -> list[str]:
        return [
            f"{c.op.removeprefix('switch_')}:{c.arg}"
            for c in await self.host.journal("switch_model", "switch_agent")
        ]

    async def prompts(self, session_id: str) -> list[Any]:
        return [p for p in (await self.host.snapshot()).prompts if p.session_id == session_id]

    async def create(self, *, interactive: bool = True, idle: bool = True, **kwargs: Any) -> str:
        """The common setup of docs/reference/loopd.md#s7-e: agent "old", model "p/old", read-only; idle
        unless told otherwise."""
        args: dict[str, Any] = {"model": "p/old", "agent": "old", "workspace_write": False}
        args.update(kwargs)
        state = await self.goals.create("g", "objective", Ctx.new(), interactive=interactive, **args)
        if idle:
            await self.answer(state.goal_id)
        return state.goal_id

    async def answer(self, goal_id: str) -> None:
        """The worker answers its prompt (the host says idle, as OpenCode does), then the engine's idle turn."""
        await self.replied(goal_id)
        await self.goals.idle(goal_id, Ctx.new())

    async def replied(self, goal_id: str) -> None:
        """The goal's worker answers its latest prompt and goes idle (a prompt leaves it busy until then)."""
        session = (await self.state(goal_id)).worker_session_id
        if session is not None:
            await self.host.reply(session)


@asynccontextmanager
async def world(tmp_path: Path, script: HostScript = SCRIPT) -> AsyncIterator[World]:
    store = await open_store(f"sqlite:{tmp_path / 'events.db'}")
    clock = FakeClock(T0)
    host = SimulatedHost(script, clock=clock)
    try:
        yield World(store, host, clock, Goals(GoalService(store, host, clock=clock)))
        from ._engine_harness import replays_as_recorded

        await replays_as_recorded(store)
    finally:
        await store.aclose()
