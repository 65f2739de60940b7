"""``loopd-es run``: one long-running engine per log, with a standby that takes over when the lease expires.

The process waits for the lease (standing by while another engine holds it), then runs one reactor: host
events arrive on a queue, the log's files wake it when another process appends (the projector's watcher), and
it sleeps no longer than the next timer or a short poll. Each turn of the loop handles the queued host events,
catches up with the log and runs due timers; a task of its own renews the lease on time. Losing the lease
(another engine took it after this one stalled) stops the engine and sends it back to standing by.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import anyio
import anyio.abc

from ..clock import Clock, SystemClock, from_us, iso, to_us
from ..domain.loop import decide
from ..errors import StorageError, UsageError
from ..host import open_host
from ..host.errors import HostError
from ..host.events import AnyHostEvent, EngineHost, ReportsHealth
from ..log import open_store
from ..log.sqlite import SqliteLog
from ..procs.paths import CommandPaths
from ..procs.service import reconcile
from ..projector.watch import Waker, log_files, watch_commits, watch_log
from ..sched.runner import Scheduler
from . import tool_server
from .balance import Balancer
from .core import Engine, EngineConfig
from .fence import FencedStore
from .goal_fence import GoalFencedStore
from .lease import DEFAULT_TTL_MS, Lease, LeaseLostError
from .shares import MEMBER_PREFIX, GoalLostError, Shares
from .status import EngineStatus
from .tool_api import ToolApiConfig, ToolDispatcher, hidden_from_workers, tool_handler

if TYPE_CHECKING:
    from ..app.turns import Guard
    from ..log.base import LogStore

log = logging.getLogger("loopd_es.engine")

BALANCE_EVERY: Final = timedelta(milliseconds=300)
"""How often a shared engine looks for goals to claim or hand over (claims are rare; the pass is cheap)."""
POLL_S: Final = 0.5
"""The longest the reactor sleeps without looking at the log (a safety net under the file watcher)."""


@dataclass
class RunOptions:
    store_url: str
    host_url: str
    holder: str
    config: EngineConfig
    lease_ms: int = DEFAULT_TTL_MS
    directory: str = "."
    due_schedules: DueHook | None = None
    """Called with the engine's time on every maintenance pass (scheduled loops fire their due slots there)."""
    tool_api: Path | None = None
    loops: bool = True
    """Fire due /loop slots and goal schedules of every session (exactly once per slot, whoever else fires)."""
    claim_ttl_ms: int | None = None
    """How long a /loop fire record holds between renewals before another runner may record the fire lost
    (None: the default)."""
    shared: bool = False
    """Run as one member of a group of engines sharing the log's goals (:mod:`.shares`) instead of standing by."""


Say = Callable[[str], None]
DueHook = Callable[[datetime], Awaitable[int]]


@dataclass
class Running:
    """What every stage of a running daemon shares: its options, the log, the host, the clock, the stop signal,
    how it speaks, and what it says about outages."""

    options: RunOptions
    store: LogStore
    host: EngineHost
    clock: Clock
    stop: anyio.Event
    say: Say
    outage: Outage


def check_tool_channel(options: RunOptions) -> None:
    """An engine that drives OpenCode serves its tools: without them its workers would get no worker tools
    and the owner tools only the tools map hides.

    :raises UsageError: saying how to set the channel up, when the host is OpenCode and there is none.
    """
    if options.tool_api is None and options.host_url.strip().startswith("opencode:"):
        raise UsageError(
            f"an engine driving OpenCode must serve its tools, and {options.directory} has no tool channel: "
            "run `loopd-es opencode install` in the project (or pass --tool-api FILE)"
        )


async def run_daemon(options: RunOptions, stop: anyio.Event, say: Say, clock: Clock | None = None) -> None:
    """Stand by, hold the lease, run the engine; until ``stop`` is set (then release the lease).

    Only a store that cannot be opened at start, or bad usage, ends it with an error. Everything that can pass
    (the store or the host unreachable for a while, a stall past the lease, a busy tool channel) is said once,
    waited out with backoff, and the engine stands by or rejoins and carries on.
    """
    check_tool_channel(options)
    clock = clock or SystemClock()
    async with await open_store(options.store_url) as store:
        # a write that waits for another process's lock longer than the lease is lost anyway: fail, say so, retry
        if isinstance(store, SqliteLog):
            store.busy_timeout_ms = min(store.busy_timeout_ms, max(options.lease_ms, 1000))
        host = await open_host(options.host_url)
        try:
            if not isinstance(host, EngineHost):
                raise UsageError(f"host {options.host_url} has no event stream; `loopd-es run` needs one")
            status = EngineStatus(options.store_url, options.holder)
            run = Running(options, store, host, clock, stop, say, Outage(say, status))
            if isinstance(host, ReportsHealth):  # a host that stops answering is an outage, said once
                host.on_health = run.outage.host_health
            lease = Lease(store, options.holder, clock, ttl_ms=options.lease_ms)
            try:
                async with anyio.create_task_group() as tools:
                    if (
                        options.tool_api is not None
                    ):  # a standby answers too: a call during a takeover is served
                        await tools.start(_tools, run)
                    await _run_until_stopped(run, lease)
                    tools.cancel_scope.cancel()
            finally:
                status.remove()
        finally:
            await host.aclose()


async def _run_until_stopped(run: Running, lease: Lease) -> None:
    """Stand by or serve, again and again, until ``stop``; release the lease whatever happens."""
    stop, say, outage = run.stop, run.say, run.outage
    try:
        while not stop.is_set():
            try:
                if run.options.shared:
                    await _run_shared(run, lease)
                else:
                    if not await _stand_by(run, lease):
                        break
                    await _serve_exclusive(run, lease)
            except* LeaseLostError as group:
                say(f"lost the engine lease ({group.exceptions[0]}); standing by")
                outage.now("standing by", f"lost the lease: {group.exceptions[0]}")
            except* TRANSIENT as group:
                outage.failed(group.exceptions[0])
                with anyio.move_on_after(outage.backoff()):
                    await stop.wait()
    finally:  # a clean stop, and a failed start too, must not leave a fresh lease to run out
        with anyio.CancelScope(shield=True), anyio.move_on_after(5), contextlib.suppress(Exception):
            await lease.release()


TRANSIENT: Final = (StorageError, HostError, OSError)
"""What a running engine waits out instead of dying: the store or the host unreachable, a full disk."""


class Outage:
    """Says once that the store (or host) went away and once that it is back; spaces the retries out; keeps
    the engine's status file (``loopd-es engines``) saying what it is doing."""

    def __init__(self, say: Say, status: EngineStatus | None = None) -> None:
        self.say = say
        self.status = status
        self.since: float | None = None
        self.delay = 0.0
        self.state = ("starting", "")
        self.lease_failing = False
        """The lease cannot be renewed: reads that go through (a full disk, a locked SQLite file) end nothing."""
        self.host_failing = False
        """The host failed: the store answering (the lease taken again) ends nothing, only serving does."""
        self.host_down: BaseException | None = None
        """The host says it does not answer (:meth:`host_health`): only the host saying it answers again ends
        the outage, whatever else goes through meanwhile."""

    def now(self, state: str, detail: str = "") -> None:
        """What the engine is doing now (the status keeps saying "waiting" until the store answers again)."""
        self.state = (state, detail)
        if self.status is not None and self.since is None:
            self.status.set(state, detail)

    def failed(self, error: BaseException, *, lease: bool = False) -> None:
        """The store or host failed; ``lease``: a renewal of the held lease did (said once all the same)."""
        self.lease_failing = self.lease_failing or lease
        self.host_failing = isinstance(error, HostError)
        if self.since is None:
            self.since = time.monotonic()
            self.say(f"waiting for the store or host: {error}; retrying with backoff (nothing is lost)")
            if self.status is not None:
                self.status.set("waiting for the store or host", str(error))
            self.delay = 0.25
        else:
            self.delay = min(self.delay * 2, MAX_BACKOFF_S)

    def host_health(self, error: BaseException | None) -> None:
        """The host stopped answering (``error``: said once, as a store outage is) or answers again."""
        if error is not None:
            self.host_down = error
            self.failed(error)
        elif self.host_down is not None:
            self.host_down = None
            self.host_failing = False
            self.ok()

    def backoff(self) -> float:
        return self.delay

    def not_serving(self) -> None:
        """Standing by (the lease ran out, or serving failed): the next lease call that goes through ends an
        outage; only a serving engine's reads must wait for its lease's renewal."""
        self.lease_failing = False

    def ok(self, *, lease: bool = False, store_only: bool = False) -> None:
        """A call went through (``lease``: a renewal did; ``store_only``: a store call, which says nothing of the
        host); until a renewal does, only a renewal ends an outage, and only serving ends the host's."""
        if lease:
            self.lease_failing = False
        elif self.lease_failing:
            return
        if self.host_down is not None:
            return
        if store_only and self.host_failing:
            return
        self.host_failing = False
        if self.since is not None:
            self.say(
                f"the store and host answer again after {time.monotonic() - self.since:.1f} s; carrying on"
            )
            self.since = None
            self.now(*self.state)


MAX_BACKOFF_S: Final = 5.0


async def _stand_by(run: Running, lease: Lease) -> bool:
    """Wait until this process holds the lease (``False`` when stopped first)."""
    clock, stop, say, outage = run.clock, run.stop, run.say, run.outage
    announced = None
    outage.not_serving()
    while not stop.is_set():
        member = await live_member(lease.store, clock)
        if member is not None:  # a shared group runs the goals: an exclusive engine would turn them twice
            outage.ok(store_only=True)
            if announced != member:
                say(f"standing by: the goals are shared by engines started with --shared ({member} is live)")
                outage.now("standing by", f"a shared group runs the goals ({member} is live)")
                announced = member
            with anyio.move_on_after(lease.ttl.total_seconds() / 3):
                await stop.wait()
            continue
        holder = await lease.try_acquire()
        outage.ok(store_only=True)  # not after the read above: on a full disk reads work and the write fails
        if holder is None:
            if outage.since is None:  # in an outage, taking the lease again to retry is no news
                say(f"engine running: holder {lease.holder}, fencing token {lease.token}")
            outage.now("running", f"holds the engine lease, fencing token {lease.token}")
            return True
        if holder.holder != announced:
            until = iso(from_us(holder.expires_us)) if holder.expires_us else "?"
            say(f"standing by: the engine lease is held by {holder.holder} until {until}")
            outage.now("standing by", f"the lease is held by {holder.holder}")
            announced = holder.holder
        wait = (from_us(holder.expires_us) - clock.now()).total_seconds() if holder.expires_us else 0.5
        with anyio.move_on_after(min(max(wait, 0.05), lease.ttl.total_seconds() / 3)):
            await stop.wait()
    return False


async def _run_shared(run: Running, lease: Lease) -> None:
    """Join the group of engines sharing the log's goals, run this member's share until stopped, leave."""
    clock, stop, say, outage = run.clock, run.stop, run.say, run.outage
    announced = None
    while not stop.is_set():
        holder = await lease.current()
        outage.ok(store_only=True)
        if holder is None or not holder.live(to_us(clock.now())):
            break
        if holder.holder != announced:  # an exclusive engine runs every goal: joining would turn them twice
            say(f"standing by: the engine lease is held by {holder.holder} (started without --shared)")
            outage.now("standing by", f"an exclusive engine ({holder.holder}) runs the goals")
            announced = holder.holder
        with anyio.move_on_after(lease.ttl.total_seconds() / 3):
            await stop.wait()
    if stop.is_set():
        return
    shares = Shares(run.store, run.options.holder, clock, ttl_ms=run.options.lease_ms)
    await shares.join()
    say(f"engine running: member {shares.member} of the engines sharing this log")
    outage.now("running", f"member {shares.member} of a shared group")

    async def renew() -> None:
        while True:
            await anyio.sleep(max(0.0, (shares.renew_due() - clock.now()).total_seconds()))
            try:
                await shares.renew()
            except TRANSIENT as e:  # the membership runs out unless a later renewal lands; then it rejoins
                log.debug("membership renewal failed, retrying: %s", e)
                await anyio.sleep(min(0.5, shares.ttl.total_seconds() / 6))

    try:
        await _serve(run, GoalFencedStore(run.store, shares), shares.check, renew, shares)
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            try:
                await shares.leave()
            except TRANSIENT as e:  # the others take the goals over once the membership runs out
                say(f"could not leave the group cleanly ({e}); the others take over when it runs out")


async def live_member(store: LogStore, clock: Clock) -> str | None:
    """A live member of a shared group on this log, if any (read from the coordination records)."""
    now = to_us(clock.now())
    live = [r.key[len(MEMBER_PREFIX) :] for r in await store.coord_read(MEMBER_PREFIX) if r.live(now)]
    return live[0] if live else None


async def _serve_exclusive(run: Running, lease: Lease) -> None:
    clock, outage = run.clock, run.outage

    async def renew() -> None:
        """Renew on time even while the engine is busy (a long start-up reading a big log); a failed renewal
        is retried until the lease runs out by this process's clock (then :class:`LeaseLostError`)."""
        failing = False
        while True:
            await anyio.sleep(max(0.0, (lease.renew_due() - clock.now()).total_seconds()))
            try:
                await lease.renew()
                if failing:
                    outage.ok(lease=True)
                failing = False
            except TRANSIENT as e:  # said once, with the status, as every outage is
                outage.failed(e, lease=True)
                failing = True
                await anyio.sleep(min(0.5, lease.ttl.total_seconds() / 6))

    await _serve(run, FencedStore(run.store, lease), lease.check, renew, None)


async def _serve(
    run: Running,
    view: LogStore,
    guard: Guard,
    renew: Callable[[], Coroutine[Any, Any, None]],
    shares: Shares | None,
) -> None:
    """Run one engine on ``view`` (the log fenced by the lease or by this member's claims) until stopped."""
    store, host, options, clock, stop = run.store, run.host, run.options, run.clock, run.stop
    engine = Engine(
        view,
        host,
        clock,
        options.config,
        directory=options.directory,
        owner=options.holder,
        guard=guard,
        shares=shares,
        store_url=options.store_url,
    )
    balancer = Balancer(engine, shares, clock) if shares is not None else None
    next_balance = clock.now()
    engine.due_schedules = options.due_schedules
    send, receive = anyio.create_memory_object_stream[AnyHostEvent | None](math.inf)
    waker = Waker()
    watch_stop = anyio.Event()

    async def pump_host() -> None:
        async for event in host.events():
            send.send_nowait(event)

    async def pump_log() -> None:
        commits = getattr(store, "commits", None)  # a database server notifies its followers itself
        if commits is not None:
            await watch_commits(commits(), waker)
        else:
            await watch_log(log_files(options.store_url), waker, watch_stop, debounce=0, step=1)

    async def wake_on_log() -> None:
        while True:
            if await waker.wait(3600):
                send.send_nowait(None)

    async with send, receive, anyio.create_task_group() as tg:  # closed even when a start fails
        if options.loops:
            tg.start_soon(_loops, run)
        tg.start_soon(pump_host)
        tg.start_soon(pump_log)
        tg.start_soon(wake_on_log)
        tg.start_soon(renew)
        try:
            await _reconcile_commands(store, options.store_url, run.say)
            await engine.start()
            run.outage.ok()
            while not stop.is_set():
                wake = engine.next_wakeup()
                if balancer is not None:
                    wake = next_balance if wake is None else min(wake, next_balance)
                timeout = _sleep_for(wake, clock.now())
                item: AnyHostEvent | None = None
                with anyio.move_on_after(timeout):
                    item = await receive.receive()
                if stop.is_set():
                    break
                batch = [item]
                while True:
                    try:
                        batch.append(receive.receive_nowait())
                    except anyio.WouldBlock:
                        break
                try:
                    for event in batch:
                        if event is not None:
                            await engine.on_host_event(event)
                    if shares is None:
                        await engine.guard(None)
                    await engine.catch_up()
                    await engine.run_due()
                    if balancer is not None and clock.now() >= next_balance:
                        await balancer.run()
                        next_balance = clock.now() + BALANCE_EVERY
                except* GoalLostError as group:  # a stalled member: its goals went to others; it carries on
                    log.info("%s", group.exceptions[0])
                run.outage.ok()
        finally:
            watch_stop.set()
            tg.cancel_scope.cancel()


async def _reconcile_commands(store: LogStore, store_url: str, say: Say) -> None:
    """As the reference does at start-up: commands of this machine whose owner died are marked missing (their
    awaits fire, and the engine then wakes their goals once). Version-checked appends, safe beside any other
    process doing the same, so the log itself is used, not this engine's fenced view."""
    marked = await reconcile(store, CommandPaths(store_url))
    if marked:
        say(f"marked {marked} command(s) whose owner is gone as missing")


async def _loops(run: Running) -> None:
    """The scheduled loops, fired by the engine as ``loopd-es loop run --all-sessions`` would fire them.

    A slot is taken by an append at the session stream's expected version, so the engine and any other
    runner never fire one slot twice; the engine's own lease fences its goal decisions, a fire's events are
    fenced on the session's fire record (:mod:`loopd_es.sched.fires`). A fire in progress when the engine stops
    (SIGTERM) is finished and recorded first (shielded, within :data:`FIRE_GRACE_S`), so it is not left to be
    recorded lost.
    """
    store, host, clock, options = run.store, run.host, run.clock, run.options

    cfg = (
        decide.Config() if options.claim_ttl_ms is None else decide.Config(claim_ttl_ms=options.claim_ttl_ms)
    )
    sched = Scheduler(
        store,
        host,
        clock,
        claimer=f"engine-{options.holder}",
        all_sessions=True,
        owner=options.holder,
        cfg=cfg,
    )
    failing = False
    try:
        while True:
            with anyio.CancelScope(shield=True), anyio.move_on_after(FIRE_GRACE_S):
                try:
                    await sched.fire_due()
                    failing = False
                except TRANSIENT as e:  # the next tick re-reads and decides again
                    if not failing:  # said once a streak: an outage must not fill stderr (or a full disk)
                        log.warning("loop tick failed, retrying: %s", e)
                    failing = True
            wake = sched.next_wake()
            pause = 1.0 if wake is None else min(1.0, max(0.0, (wake - clock.now()).total_seconds()))
            await anyio.sleep(1.0 if failing else pause)  # a failing store is not retried in a tight loop
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(2):
            try:
                await sched.release()
            except TRANSIENT:
                pass  # the lease runs out by itself


FIRE_GRACE_S: Final = 20.0
"""How long a stopping engine waits for a /loop fire in progress to finish and be recorded."""


async def _tools(
    run: Running, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    """Serve the OpenCode tools; workers' prompts then carry a tools map that hides the owner tools."""
    options, host = run.options, run.host
    assert options.tool_api is not None
    config = ToolApiConfig.load(options.tool_api)
    if hasattr(host, "tools"):
        host.tools = hidden_from_workers()
    dispatcher = ToolDispatcher(run.store, host, run.clock, options.directory, store_url=options.store_url)
    async with anyio.create_task_group() as tg:
        await tg.start(tool_server.serve, Path(config.socket), config.token, tool_handler(dispatcher.call))
        run.say(f"serving the OpenCode tools on {config.socket}")
        task_status.started()


def _sleep_for(timer: datetime | None, now: datetime) -> float:
    if timer is None:
        return POLL_S
    return max(0.0, min(POLL_S, (timer - now).total_seconds()))
