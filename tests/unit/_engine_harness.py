"""An engine on a real SQLite log and an in-memory simulated host, driven by a fake clock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loopd_es.clock import FakeClock
from loopd_es.engine.core import Engine, EngineConfig
from loopd_es.engine.operations import Operations
from loopd_es.host import SimulatedHost
from loopd_es.host.sim_script import HostScript
from loopd_es.log import open_store

if TYPE_CHECKING:
    from loopd_es.domain.state import GoalState
    from loopd_es.host.events import AnyHostEvent
    from loopd_es.log.base import LogStore


@dataclass
class Rig:
    store: LogStore
    host: SimulatedHost
    clock: FakeClock
    engine: Engine
    ops: Operations
    seen: list[AnyHostEvent]

    async def state(self, goal_id: str) -> GoalState:
        self.engine.service.forget(goal_id)
        return await self.engine.service.load(goal_id)

    async def pump(self) -> int:
        """Hand every host event emitted so far to the engine, in order (what ``loopd-es run`` does)."""
        handled = 0
        while self.seen:
            event = self.seen.pop(0)
            await self.engine.on_host_event(event)
            handled += 1
        await self.engine.catch_up()
        return handled

    async def advance(self, seconds: float) -> None:
        """Move the clock, then run what became due (timers, maintenance) and the events that caused."""
        self.clock.advance(seconds)
        await self.engine.catch_up()
        await self.engine.run_due()
        await self.pump()

    async def prompts(self, session_id: str | None = None) -> list[str]:
        state = await self.host.snapshot()
        return [p.text for p in state.prompts if session_id is None or p.session_id == session_id]

    async def types(self, goal_id: str) -> list[str]:
        return [e.type async for e in self.store.read_stream(f"goal-{goal_id}")]

    async def started(self, name: str = "g", **config: Any) -> tuple[str, str]:
        """A goal created and running its first turn, and its worker session."""
        goal_id = await self.create(name, **config)
        session = (await self.state(goal_id)).worker_session_id
        assert session is not None
        return goal_id, session

    async def create(self, name: str = "g", **config: Any) -> str:
        result = await self.ops.create(name, f"objective of {name}", **config)
        assert result.goal_id is not None
        await self.engine.catch_up()
        await self.pump()
        return result.goal_id


@asynccontextmanager
async def rig(
    tmp_path: Path,
    script: HostScript | None = None,
    config: EngineConfig | None = None,
) -> AsyncIterator[Rig]:
    clock = FakeClock()
    # these tests hand the engine the host's events themselves (idle pairs in the order under test), so a
    # prompt must not leave the simulated session busy by itself (the host's default, as OpenCode)
    host = SimulatedHost(script or HostScript(prompt_busy_polls=0), clock=clock)
    async with await open_store(f"sqlite:{tmp_path / 'events.db'}") as store:
        engine = Engine(
            store,
            host,
            clock,
            config or EngineConfig(),
            directory=str(tmp_path),
            store_url=f"sqlite:{tmp_path / 'events.db'}",
        )
        ops = Operations(store, host, clock=clock, directory=str(tmp_path), owner="owner-1")
        seen: list[AnyHostEvent] = []
        host._subscribers.append(_Collector(seen))  # type: ignore[arg-type]
        await engine.start()
        engine.next_maintenance = None  # tests run maintenance when they say so
        yield Rig(store, host, clock, engine, ops, seen)
        await replays_as_recorded(store)


async def replays_as_recorded(store: LogStore) -> None:
    """Every engine (and saga) test doubles as a determinism check: each goal it wrote re-decides as recorded."""
    from loopd_es.replay.redecide import replay_goal_events
    from loopd_es.replay.whatif import goal_streams

    for goal_id, envs in (await goal_streams(store)).items():
        divergence = replay_goal_events(envs).divergence
        assert divergence is None, (
            f"goal {goal_id} does not replay as recorded (replay --check): {divergence}"
        )


class _Collector:
    """A subscriber that keeps events in a list (the test decides when the engine sees them)."""

    def __init__(self, into: list[AnyHostEvent]) -> None:
        self.into = into

    def send_nowait(self, event: AnyHostEvent) -> None:
        self.into.append(event)
