"""A fake-clock world for ``/loop`` scenarios: a real SQLite log, the simulated host, one or more schedulers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loopd_es.clock import FakeClock, from_ms, to_ms
from loopd_es.domain.loop import decide
from loopd_es.events import loop as ev
from loopd_es.events.catalogue import decode_payload
from loopd_es.host.sim_script import HostScript, ScriptSession
from loopd_es.host.simulated import SimulatedHost
from loopd_es.log import open_store
from loopd_es.sched import service
from loopd_es.sched.runner import FireReport, Scheduler

if TYPE_CHECKING:
    from loopd_es.domain.loop.model import SessionLoops, Task
    from loopd_es.log.base import LogStore

T0 = 1_800_000_000_000


def ms(at: datetime | None) -> int:
    """An instant of the folded state as epoch ms, to compare with the scenarios' numbers (``None`` fails)."""
    assert at is not None
    return to_ms(at)


class World:
    def __init__(self, store: LogStore, host: SimulatedHost, clock: FakeClock, tmp: Path, cfg: decide.Config):
        self.store, self.host, self.clock, self.tmp, self.cfg = store, host, clock, tmp, cfg
        self.project = tmp / "proj"
        self.home = tmp / "home"
        self.project.mkdir(exist_ok=True)
        self.home.mkdir(exist_ok=True)
        self.sched = self.scheduler("engine-1")
        self.u = 0.5

    @property
    def now(self) -> int:
        """The fake clock in epoch ms, the unit of the /loop deciders' slot arithmetic."""
        return to_ms(self.clock.now())

    @now.setter
    def now(self, ms: int) -> None:
        self.clock.set(from_ms(ms))

    @property
    def at(self) -> datetime:
        """The fake clock's time, what the deciders and services take."""
        return self.clock.now()

    def scheduler(self, name: str, **kw: Any) -> Scheduler:
        return Scheduler(
            self.store, self.host, self.clock, claimer=name, cfg=self.cfg, rng=lambda: self.u, **kw
        )

    async def loop(self, args: str, session: str | None = "s1", **kw: Any) -> decide.Outcome:
        kw.setdefault("u", self.u)
        return await service.handle(
            self.store, args, session_id=session, now=self.at, cfg=self.cfg,
            directory=self.project, home=self.home, **kw,
        )  # fmt: skip

    async def tick(self, sched: Scheduler | None = None) -> FireReport:
        return await (sched or self.sched).fire_due()

    async def session(self, sid: str = "s1") -> SessionLoops:
        return await service.read_session(self.store, sid)

    async def task(self, task_id: str, sid: str = "s1") -> Task:
        return (await self.session(sid)).tasks[task_id]

    async def prompts(self, sid: str | None = None) -> list[str]:
        snap = await self.host.snapshot()
        return [p.text for p in snap.prompts if sid is None or p.session_id == sid]

    async def events(self, sid: str = "s1") -> list[Any]:
        return [
            decode_payload(env) async for env in self.store.read_all() if env.stream == ev.session_stream(sid)
        ]

    async def activate(self, sid: str) -> None:
        await service.activate(self.store, sid, self.at)


@asynccontextmanager
async def world(
    tmp_path: Path, *, sessions: tuple[str, ...] = ("s1", "s2"), **cfg: Any
) -> AsyncIterator[World]:
    # the worker answers each fire at once (a prompt leaves a session busy until its answer, as OpenCode)
    script = HostScript(sessions=tuple(ScriptSession(id=s) for s in sessions), auto_reply=True)
    clock = FakeClock(from_ms(T0))
    async with await open_store(f"sqlite:{tmp_path / 'events.db'}") as store:
        yield World(store, SimulatedHost(script), clock, tmp_path, decide.Config(**cfg))
