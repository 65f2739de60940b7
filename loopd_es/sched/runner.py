"""``fire_due(now)``: claim every due slot, inject it through the host port, record the outcome.

The engine calls :meth:`Scheduler.fire_due` from its tick (with its own clock); ``loopd-es loop tick`` and
``loop run`` call it too. Any number of schedulers may run against one log: a slot is fired only by the
one whose ``loop.slot_claimed`` append met the session stream's expected version, and the injection uses
the slot key as the host's prompt id, so a retry of the same slot is recognisable to the host. Who is firing
a session right now is its fire record beside the log (:mod:`.fires`), renewed during the host call; the
fire's events are fenced on it, and nothing about it is written to the log.

For the engine::

    sched = Scheduler(store, host, clock, claimer=engine_id, owner=engine_id, all_sessions=True)
    report = await sched.fire_due()   # on every tick: sweeps, goal ticks, due slots
    wake_at = sched.next_wake()       # the time worth waking for (None: nothing scheduled)

``clock`` is the one :class:`loopd_es.clock.Clock`; every time here is its aware UTC datetime.
:func:`loopd_es.domain.loop.decide.due_now` is the pure "what is due at T".
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Final

import anyio
import msgspec

from ..clock import EPOCH, from_us
from ..domain.loop import decide
from ..domain.loop.due import DueIndex
from ..domain.loop.model import SessionLoops, evolve
from ..errors import LoopdError, WrongExpectedVersionError
from ..events import loop as ev
from ..events.catalogue import decode_payload, new_event
from ..host.errors import HostError
from ..log.coord import FenceLostError
from . import fires, service
from .goals import GoalSlots
from .service import read_loop_file

if TYPE_CHECKING:
    from ..clock import Clock
    from ..events.base import Event
    from ..events.envelope import Envelope
    from ..host.base import WorkerHost
    from ..log.base import LogStore
    from ..log.coord import Fence

_RETRIES: Final = 20
INTERRUPTED: Final = "interrupted: the runner stopped before the host call's outcome was known"
_SETTLE_S: Final = 2.0
"""How long a cancelled fire may take to record that it was interrupted and release its record."""
WAIT_RETRY: Final = timedelta(seconds=1)
"""How soon a due slot that had to wait (its session busy or not the user's) is looked at again, unless the log
changes first (the session activated, a fire recorded): the host's busy/idle is polled, not an event."""
_LEASE_SWEEP_EVERY: Final = timedelta(minutes=1)
log = logging.getLogger(__name__)
_NS: Final = uuid.UUID("0b7d6a52-8c1e-4f0e-a7c4-3c1d2f9e5a10")


class FireReport(msgspec.Struct, kw_only=True):
    """What one ``fire_due`` did: slots fired / failed, slots recorded missed, housekeeping events, waits."""

    fired: list[tuple[str, int]] = msgspec.field(default_factory=list)
    failed: list[tuple[str, int, str]] = msgspec.field(default_factory=list)
    missed: int = 0
    swept: int = 0
    waiting: int = 0
    lost: int = 0
    goal_ticks: int = 0


def slot_key(task_id: str, slot: int) -> str:
    """The identity of one occurrence, used as the host prompt id (the same for every retry)."""
    return f"loop-{task_id}-{slot}"


class Scheduler:
    """Folds ``loop.*`` and goal events into memory and fires due slots; see the module docstring.

    ``all_sessions`` fires every session's tasks (a headless engine); otherwise only the active session's
    (docs/reference/loop-plugin.md#s3-10). ``owner`` names this scheduler's lease: it adopts durable tasks of
    dead owners.
    """

    def __init__(
        self,
        store: LogStore,
        host: WorkerHost,
        clock: Clock,
        *,
        claimer: str,
        cfg: decide.Config | None = None,
        all_sessions: bool = False,
        owner: str | None = None,
        lease_ttl_ms: int = 15_000,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.store, self.host, self.clock = store, host, clock
        self.claimer, self.cfg = claimer, cfg or decide.Config()
        self.all_sessions, self.owner, self.lease_ttl_ms, self.rng = all_sessions, owner, lease_ttl_ms, rng
        self.sessions: dict[str, SessionLoops] = {}
        self.active: str | None = None
        self.parents: dict[str, str] = {}
        self.leases: dict[str, datetime] = {}
        self.fires = fires.Records(store, fires.SESSION_PREFIX, holder=claimer, clock=clock,
                                   ttl_ms=self.cfg.claim_ttl_ms, on_change=self._fire_record_changed)  # fmt: skip
        self.position = 0
        self.due = DueIndex()
        self.sweeps = DueIndex()
        self.goals = GoalSlots(store, holder=claimer, clock=clock, ttl_ms=self.cfg.claim_ttl_ms)
        self._owned: dict[str, set[tuple[str, str]]] = {}
        self._lease_until = EPOCH
        self._next_lease_sweep = EPOCH

    # -- folding ----------------------------------------------------------------------------------------

    async def refresh(self) -> None:
        """Fold everything appended since the last call (by this or any other process), then read the owners'
        leases as the coordination records hold them now. Fire records are read when needed, after this."""
        async for batch in self.store.read_batches(from_position=self.position + 1):
            for env in batch:
                self.position = env.position
                self._apply(env)
        leases = service.lease_expiries(await self.store.coord_read(service.OWNER_PREFIX))
        for owner in set(self.leases) | set(leases):
            expires = leases.get(owner, EPOCH)
            if self.leases.get(owner, EPOCH) != expires:
                self._lease_changed(owner, expires)

    def _fire_record_changed(self, sid: str) -> None:
        s = self.sessions.get(sid)
        for t in s.started() if s is not None else ():
            self.sweeps.push(self._sweep_at(sid, t.task_id), sid, t.task_id)

    async def release(self) -> None:
        """Drop this scheduler's owner lease (a clean stop): its ephemeral tasks end at the next sweep."""
        if self.owner is not None:
            await service.release_lease(self.store, self.owner)
            self._lease_until = EPOCH

    def _lease_changed(self, owner: str, expires: datetime) -> None:
        self.leases[owner] = expires
        for sid, tid in self._owned.get(owner, ()):
            self.sweeps.push(self._sweep_at(sid, tid), sid, tid)

    async def _absorb(self, envs: list[Envelope]) -> None:
        """Fold our own just-appended events without a read when nothing else was appended in between."""
        if envs and envs[0].position == self.position + 1:
            for env in envs:
                self.position = env.position
                self._apply(env)
        else:
            await self.refresh()

    def _apply(self, env: Envelope) -> None:
        stream = env.stream
        if stream.startswith(ev.SESSION_PREFIX):
            sid = stream[len(ev.SESSION_PREFIX) :]
            self.due.undefer(
                sid
            )  # a fire recorded, a task paused: what its waiting slots wait on may be over
            s = self.sessions.get(sid) or self.sessions.setdefault(sid, SessionLoops(session_id=sid))
            e = decode_payload(env)
            evolve(s, e)
            s.version = env.version
            tid = getattr(e, "task_id", None)
            if tid is not None and tid in s.tasks:
                self._index(s, tid)
        elif stream == ev.ACTIVE_STREAM:
            self.due.undefer()  # another session may be the active one now
            e = decode_payload(env)
            if isinstance(e, ev.SessionActivated):
                self.active = self.root(e.session_id)
            elif isinstance(e, ev.SessionLinked):
                self.parents[e.session_id] = e.parent_id
            elif isinstance(e, ev.SessionDeleted) and self.active == e.session_id:
                self.active = None
        elif stream.startswith(ev.LEASE_PREFIX):
            pass  # owners' leases written as events before 0.4: the coordination records hold them now
        else:
            self.goals.apply(env)

    def _index(self, s: SessionLoops, tid: str) -> None:
        t = s.tasks[tid]
        self.due.push(t.due_at(), s.session_id, tid)
        self.sweeps.push(self._sweep_at(s.session_id, tid), s.session_id, tid)
        if t.owner is not None:
            self._owned.setdefault(t.owner, set()).add((s.session_id, tid))

    def root(self, session_id: str) -> str:
        """A child session's root: its tasks fire while the user works in a sub-agent
        (docs/reference/loop-plugin.md#s3-10)."""
        seen = {session_id}
        while session_id in self.parents and self.parents[session_id] not in seen:
            session_id = self.parents[session_id]
            seen.add(session_id)
        return session_id

    def _due_of(self, sid: str, tid: str) -> datetime | None:
        t = self.sessions[sid].tasks.get(tid)
        return t.due_at() if t is not None else None

    def _sweep_at(self, sid: str, tid: str) -> datetime | None:
        t = self.sessions[sid].tasks.get(tid)
        return (
            None
            if t is None
            else decide.sweep_at(t, self.leases, self.fires.in_flight(sid), runner=self.owner)
        )

    def next_wake(self) -> datetime | None:
        """The earliest time a ``fire_due`` could do something (for a sleeping engine)."""
        found = (self.due.next_at(self._due_of), self.sweeps.next_at(self._sweep_at), self.goals.next_at())
        times = [x for x in found if x is not None]
        return min(times) if times else None

    # -- firing -----------------------------------------------------------------------------------------

    async def fire_due(self, now: datetime | None = None) -> FireReport:
        """Renew this scheduler's lease, sweep, tick due goals, then claim and fire every due slot."""
        now = self.clock.now() if now is None else now
        report = FireReport()
        ttl = timedelta(milliseconds=self.lease_ttl_ms)
        if self.owner is not None and self._lease_until - now < ttl / 2:
            await service.renew_lease(self.store, self.owner, now, self.lease_ttl_ms)
            self._lease_until = now + ttl
        if now >= self._next_lease_sweep:
            await service.sweep_owner_leases(self.store, now)
            self._next_lease_sweep = now + _LEASE_SWEEP_EVERY
        await self.refresh()
        await self._sweep(now, report)
        report.goal_ticks = await self.goals.fire_due(now, retry=WAIT_RETRY)
        left = {(sid, tid): due for due, sid, tid in self.due.pop_due(now, self._due_of)}
        try:  # whatever is left when this raises or is cancelled is indexed again (push is synchronous)
            for sid in dict.fromkeys(sid for sid, _ in left):
                items = sorted((due, tid) for (s, tid), due in left.items() if s == sid)
                await self._fire_session(sid, items, now, report)
                for _, tid in items:
                    left.pop((sid, tid), None)
        finally:  # looked at again after a pause: a tick that failed (an outage) is not retried at once
            for (sid, tid), due in left.items():
                self.due.push(due, sid, tid, look_at=self.clock.now() + WAIT_RETRY)
        return report

    async def _fire_session(
        self, sid: str, items: list[tuple[datetime, str]], now: datetime, report: FireReport
    ) -> None:
        """Fire the due slots of one session, one at a time; the rest wait (deferred) when one must."""
        if not self.all_sessions and sid != self.active:
            report.waiting += len(items)
            for due, tid in items:
                self.due.defer(due, sid, tid, self.clock.now() + WAIT_RETRY)
            return
        for i, (_, tid) in enumerate(items):
            idle = await self.host.session_status(sid) == "idle"  # "unknown" counts as not idle
            if await self._fire(sid, tid, now, report, idle=idle) == "waiting":  # one injection at a time
                report.waiting += len(items) - i
                for due, waiting in items[i:]:
                    self.due.defer(due, sid, waiting, self.clock.now() + WAIT_RETRY)
                return

    async def _sweep(self, now: datetime, report: FireReport) -> None:
        left = self.sweeps.pop_due(now, self._sweep_at)
        try:  # as in fire_due: what is left when this raises or is cancelled is indexed again
            while left:
                sid = left[0][1]
                await self._sweep_session(sid, now, report)
                left = [entry for entry in left if entry[1] != sid]
        finally:
            for at, sid, tid in left:
                self.sweeps.push(at, sid, tid, look_at=self.clock.now() + WAIT_RETRY)

    async def _sweep_session(self, sid: str, now: datetime, report: FireReport) -> None:
        for _ in range(_RETRIES):
            s = self.sessions[sid]
            hold = None
            lost: list[Event] = []
            if s.started():  # a started fire is judged by its record as the store has it now
                record = await self.fires.read(sid)
                if record is not None and fires.busy(record, now):  # held: looked at when it runs out
                    for t in s.started():
                        at = self._sweep_at(sid, t.task_id)
                        self.sweeps.push(at, sid, t.task_id, look_at=from_us(record.expires_us))
                else:
                    lost = decide.lost_fires(s, now, in_flight=None)
            if lost:  # the lost runners' record is taken over first, so they can land nothing after this
                hold = await self.fires.take(sid)
                if hold is None:
                    continue  # held live after all, or changed: read and judge again
            events = lost + decide.sweep(s, now, leases=self.leases, runner=self.owner)
            if not events:
                return
            try:
                envs = await self._append(
                    sid, events, s.version, corr=str(uuid.uuid4()), fences=[hold.fence] if hold else ()
                )
            except (WrongExpectedVersionError, FenceLostError):
                await self.refresh()
                continue
            finally:
                if hold is not None:
                    await self.fires.release(sid, hold)
            report.swept += len(events)
            await self._absorb(envs)
            return

    async def _append(
        self,
        sid: str,
        events: list[Event],
        version: int,
        *,
        causation: str | None = None,
        corr: str | None = None,
        fences: Sequence[Fence] = (),
    ) -> list[Envelope]:
        return await self.store.append(
            ev.session_stream(sid),
            [new_event(e, causation_id=causation, correlation_id=corr) for e in events],
            expected_version=version,
            fences=fences,
        )

    async def _fire(self, sid: str, tid: str, now: datetime, report: FireReport, *, idle: bool) -> str:
        for _ in range(_RETRIES):
            s = self.sessions[sid]
            t = s.tasks[tid]
            due = t.due_at()
            if due is None or due > now:
                return "gone"  # fired, paused or cancelled meanwhile (maybe by another scheduler)
            if not idle or not await self.fires.free(sid, now):
                return "waiting"  # the user's turn, or another fire in this session
            lf = None
            if t.loop_file_path is not None:  # read loop.md only for a fire that can happen
                path = t.loop_file_path
                lf = decide.LoopFile(path=path, content=await anyio.to_thread.run_sync(read_loop_file, path))
            c = decide.claim(s, tid, now, by=self.claimer, u=self.rng(), loop_file=lf,
                             in_flight=self.fires.in_flight(sid))  # fmt: skip
            if c is None:
                return "waiting"
            hold = await self.fires.take(sid, (tid, c.slot, c.attempt))
            if hold is None:
                continue  # taken by another scheduler just now (or changed): look again
            corr = str(uuid.uuid5(_NS, slot_key(tid, c.slot)))
            try:
                envs = await self._append(sid, c.events, s.version, corr=corr, fences=[hold.fence])
            except (WrongExpectedVersionError, FenceLostError):
                await self.fires.release(sid, hold)
                await self.refresh()
                continue
            await self._absorb(envs)
            report.missed += sum(e.n for e in c.events if isinstance(e, ev.SlotsMissed))
            if c.text is None:
                await self.fires.release(sid, hold)
                report.failed.append((tid, c.slot, "loop.md missing or empty"))
                return "fired"
            return await self._deliver(
                sid, tid, c, c.text, fires.Keeper(hold), (envs[-1].event_id, corr), report
            )
        return "waiting"

    async def _deliver(
        self, sid: str, tid: str, c: decide.Claim, text: str, keeper: fires.Keeper, ids: tuple[str, str],
        report: FireReport,
    ) -> str:  # fmt: skip
        """Inject the slot's prompt and record the outcome while renewing the record, then release it.

        Cancelled or failed before the outcome is recorded (the engine bounds a tick; an outage), it records the
        fire as interrupted if it can within :data:`_SETTLE_S`, and releases the record either way, so nobody
        waits for it to run out.
        """
        closed = False
        try:
            async with self.fires.renewing(keeper):
                err, prompt_id = None, ""
                try:
                    receipt = await self.host.prompt(sid, text, prompt_id=slot_key(tid, c.slot))
                    prompt_id = receipt.prompt_id
                except HostError as e:
                    err = str(e)
                done = await self._close(sid, tid, c, keeper, err, prompt_id, ids, report)
                closed = True
            return done
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(_SETTLE_S):
                if not closed:
                    await self._interrupted(sid, tid, c, keeper, ids)
                await self.fires.release(sid, keeper.hold)

    async def _interrupted(
        self, sid: str, tid: str, c: decide.Claim, keeper: fires.Keeper, ids: tuple[str, str]
    ) -> None:
        """Record, if this can, that the fire stopped before its outcome was known (best effort: failing that,
        the released record makes the next runner record it lost)."""
        t = self.sessions[sid].tasks[tid]
        if t.firing is None or (t.firing.slot, t.firing.attempt) != (c.slot, c.attempt):
            return
        events = decide.close(t, slot=c.slot, attempt=c.attempt, now=self.clock.now(), error=INTERRUPTED)
        try:
            envs = await self._append(sid, events, self.sessions[sid].version, causation=ids[0], corr=ids[1],
                                      fences=[keeper.hold.fence])  # fmt: skip
        except LoopdError as e:
            log.warning("could not record the interrupted fire of %s slot %d: %s", tid, c.slot, e)
            return
        await self._absorb(envs)

    async def _close(
        self, sid: str, tid: str, c: decide.Claim, keeper: fires.Keeper, err: str | None, prompt_id: str,
        ids: tuple[str, str], report: FireReport,
    ) -> str:  # fmt: skip
        for _ in range(_RETRIES):
            s = self.sessions[sid]
            t = s.tasks[tid]
            mine = t.firing
            if mine is None or (mine.slot, mine.attempt) != (c.slot, c.attempt):
                return self._lost(tid, c, report)
            events = decide.close(t, slot=c.slot, attempt=c.attempt, now=self.clock.now(), error=err,
                                  prompt_id=prompt_id)  # fmt: skip
            try:
                envs = await self._append(
                    sid, events, s.version, causation=ids[0], corr=ids[1], fences=[keeper.hold.fence]
                )
            except (
                WrongExpectedVersionError
            ):  # a pause, a cancel or a new task meanwhile: fold it, record again
                await self.refresh()
                continue
            except FenceLostError:
                return self._lost(tid, c, report)
            await self._absorb(envs)
            if err is None:
                report.fired.append((tid, c.slot))
                log.info("fired %s slot %d (attempt %d) in %s", tid, c.slot, c.attempt, sid)
            else:
                report.failed.append((tid, c.slot, err))
                log.info("fire of %s slot %d failed: %s", tid, c.slot, err)
            return "fired"
        return "fired"

    @staticmethod
    def _lost(tid: str, c: decide.Claim, report: FireReport) -> str:
        report.lost += 1  # another scheduler took our record over and recorded the fire as lost
        log.warning("the fire of %s slot %d outlived its record; it was recorded as lost", tid, c.slot)
        return "fired"
