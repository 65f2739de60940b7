"""``GoalService``: load a goal by folding its stream, read the facts a decision needs, decide, append.

Every event it writes carries a ``correlation_id`` (one per user request or flow, :class:`Ctx`) and a
``causation_id`` (the request, or the event that triggered the write), so ``explain`` can walk any fact back
to the request that caused it. Appends are conditional on the version the decision was made on; when another
process appended in between, the goal is read again and the command decided again (the facts too), so a
decision is never recorded against a state it did not see.

Folded goals are cached and caught up from their last version, so a flow that touches one goal many times
reads each event once; the cache is dropped on a version conflict.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

from ..clock import WALL, Clock
from ..domain import goal_commands as c
from ..domain.decide import decide
from ..domain.evolve import evolve, fold, initial
from ..domain.streams import GOAL_PREFIX, goal_stream
from ..errors import ConflictError, DomainError, WrongExpectedVersionError
from ..events.catalogue import new_event
from ..events.envelope import ANY, Envelope, ExpectedVersion, NewEvent
from ..ids import resolve_goal_id
from ..log.coord import Fence
from ..sagas.crashpoints import crashpoint
from ..sagas.ports import Companion, Ctx
from .writer_slot import writer_slot

if TYPE_CHECKING:
    from ..domain.state import GoalState
    from ..events.base import Event
    from ..host.base import AgentCatalog, ModelCatalog, WorkerHost
    from ..log.base import LogStore
    from .goal_index import GoalIndex

__all__ = ["MAX_ATTEMPTS", "Ctx", "GoalService", "domain_agent_catalog", "domain_model_catalog"]
"""``Ctx`` is re-exported: it is defined beside the sagas' port (:mod:`loopd_es.sagas.ports`)."""

MAX_ATTEMPTS: Final = 8
"""Decide-and-append attempts before a goal that keeps changing underneath is reported as a conflict."""

_CATALOG_COMMANDS: Final = (c.CreateGoal, c.SwitchIdentity, c.ApplyPendingSwitch, c.ObserveProviderError)
_WRITER_COMMANDS: Final = (c.CreateGoal, c.ResumeGoal, c.RetryGoal, c.SwitchIdentity, c.RecordSwitchOutcome)
_STATUS_COMMANDS: Final = (c.SwitchIdentity, c.ApplyPendingSwitch)
"""The commands whose deciders read ``worker_status``; any other decision would pay a host round trip for a
fact it never looks at (usage accounting, the idle confirmation and the run start sit on every turn's path)."""


FollowUp = Callable[["GoalState", "Sequence[Event]"], Awaitable["c.GoalCommand | None"]]
"""Given the state a chain's commands leave and the events they decided, the command to decide after them in
the same commit, or ``None`` (:meth:`GoalService.execute_chain`)."""

FenceFor = Callable[[str], Sequence[Fence]]
"""The fences a write about a goal carries: a shared engine's claim of the goal (raising when it lost it)."""


def _no_fence(goal_id: str) -> Sequence[Fence]:
    return ()


def domain_model_catalog(catalog: ModelCatalog) -> c.ModelCatalog:
    """The host's catalog as the deciders see it: capability, switching and usability by ``provider/model``."""
    return c.ModelCatalog(
        capability=catalog.capability,
        switching=catalog.switching,
        models={m.ref: c.ModelInfo(usable=m.usable) for m in catalog.models},
    )


def domain_agent_catalog(catalog: AgentCatalog) -> c.AgentCatalog:
    """The host's agent catalog as the deciders see it: capability, switching and the names."""
    return c.AgentCatalog(capability=catalog.capability, switching=catalog.switching, agents=catalog.names())


def takes_writer_slot(command: c.GoalCommand, before: GoalState, events: Sequence[Event]) -> bool:
    """Whether ``events`` (of a command that may activate a writer) make the goal an active workspace writer
    that ``before`` was not."""
    if not isinstance(command, _WRITER_COMMANDS):
        return False
    after = fold(events, before)
    was = before.exists and before.status == "active" and before.config.workspace_write
    return after.exists and after.status == "active" and after.config.workspace_write and not was


class GoalService:
    """Decide goal commands against the log and the host; the only writer of goal streams in the app layer."""

    def __init__(
        self,
        store: LogStore,
        host: WorkerHost,
        *,
        clock: Clock | None = None,
        directory: str = ".",
        owner: str = "cli",
        index: GoalIndex | None = None,
        fence_for: FenceFor | None = None,
    ) -> None:
        self.store = store
        self.host = host
        self.clock: Clock = clock or WALL
        self.directory = directory
        self.owner = owner
        self.index = index
        """A long-lived caller's in-memory fold of every goal: :meth:`goals` and the session look-ups use it."""
        self.fence_for: FenceFor = fence_for or _no_fence
        """The fences every write about a goal carries (a shared engine: its claim of the goal)."""
        self._cache: dict[str, GoalState] = {}

    # -- reading --------------------------------------------------------------------------------------

    async def load(self, goal_id: str) -> GoalState:
        """The goal folded from its stream (caught up from the cache); a missing goal has ``exists=False``.

        A goal not cached yet starts from the index's state when there is an index (the same fold, up to the
        index's last catch-up), so a tool call's first look at its goal reads only what came after.
        """
        state = self._cache.get(goal_id) or self._indexed(goal_id)
        stream = goal_stream(goal_id)
        if await self.store.stream_version(stream) > state.version:
            batch = [e async for e in self.store.read_stream(stream, from_version=state.version + 1)]
            state = fold(batch, state)
        self._cache[goal_id] = state
        return state

    def _indexed(self, goal_id: str) -> GoalState:
        found = self.index.states.get(goal_id) if self.index is not None else None
        return found if found is not None else initial(goal_id)

    async def goal_ids(self) -> list[str]:
        """Every goal id in the log, in stream-name order."""
        return [s[len(GOAL_PREFIX) :] for s in await self.store.streams() if s.startswith(GOAL_PREFIX)]

    async def goals(self) -> list[GoalState]:
        """Every goal that exists (cleared goals are left out)."""
        if self.index is not None:
            await self.index.catch_up()
            return self.index.existing()
        states = [await self.load(goal_id) for goal_id in await self.goal_ids()]
        return [s for s in states if s.exists]

    async def goals_of_owner(self, session_id: str) -> list[GoalState]:
        """The goals ``session_id`` owns (through the index when there is one: cost by what it touches)."""
        if self.index is not None:
            await self.index.catch_up()
            return self.index.of_owner(session_id)
        return [g for g in await self.goals() if g.owner_session_id == session_id]

    async def goals_of_worker(self, session_id: str) -> list[GoalState]:
        """The goals whose worker is ``session_id``."""
        if self.index is not None:
            await self.index.catch_up()
            return self.index.of_worker(session_id)
        return [g for g in await self.goals() if g.worker_session_id == session_id]

    async def resolve_id(self, text: str) -> str:
        """The goal whose id is ``text`` or starts with it.

        :raises UsageError: when no goal or more than one goal matches.
        """
        return resolve_goal_id(text, await self.goal_ids())

    async def facts(self, state: GoalState, command: Any = None, *, catalogs: bool | None = None) -> c.Facts:
        """What ``command`` needs from outside the stream: worker status, catalogs, active writers, the time.

        Each fact is read only for the commands whose deciders look at it (the worker status for a switch, the
        catalogs for a switch, a new goal or a provider error, the writers for commands that take a writer slot).

        A switch already in flight counts as a busy worker, so a second request made meanwhile is deferred
        instead of racing the first one's host calls.
        """
        status: Any = "unknown"
        if state.worker_session_id is not None and isinstance(command, _STATUS_COMMANDS):
            status = await self.host.session_status(state.worker_session_id)
        if state.switch_in_flight is not None:
            status = "busy"
        want_catalogs = isinstance(command, _CATALOG_COMMANDS) if catalogs is None else catalogs
        model_catalog = agent_catalog = None
        if want_catalogs:
            model_catalog = domain_model_catalog(await self.host.list_models())
            agent_catalog = domain_agent_catalog(await self.host.list_agents())
        writers: tuple[c.WriterGoal, ...] = ()
        if isinstance(command, _WRITER_COMMANDS):
            writers = tuple(
                c.WriterGoal(goal_id=g.goal_id, name=g.name, owner_session_id=g.owner_session_id)
                for g in await self.goals()
                if g.goal_id != state.goal_id and g.status == "active" and g.config.workspace_write
            )
        return c.Facts(
            now=self.clock.now(),
            active_writers=writers,
            worker_status=status,
            model_catalog=model_catalog,
            agent_catalog=agent_catalog,
            can_switch_model=model_catalog is not None and model_catalog.switching != "unsupported",
            can_switch_agent=agent_catalog is not None and agent_catalog.switching != "unsupported",
            defaults=c.CreationDefaults(directory=self.directory),
        )

    async def check(self, command: c.GoalCommand) -> None:
        """Decide ``command`` without appending anything (its rules, its arguments).

        :raises DomainError: when the command breaks a rule.
        """
        state = await self.load(command.goal_id)
        decide(command, state, await self.facts(state, command))

    # -- writing --------------------------------------------------------------------------------------

    async def execute(
        self, command: c.GoalCommand, ctx: Ctx, *, event_id: str | None = None
    ) -> list[Envelope]:
        """Decide ``command`` on the goal's current state and append the result; ``[]`` when nothing happens.

        ``event_id`` names the one event a reaction to a recorded fact decides, so a replayed reaction (a
        restart, another engine of a shared group) records it once: the log answers an exact retry with the
        original.

        :raises DomainError: when the command breaks a rule (nothing is appended).
        :raises ConflictError: when the goal kept changing for :data:`MAX_ATTEMPTS` attempts.
        """
        return await self._execute(command, ctx, event_id, ())

    async def _execute(
        self, command: c.GoalCommand, ctx: Ctx, event_id: str | None, slot: tuple[Fence, ...]
    ) -> list[Envelope]:
        """:meth:`execute`; ``slot``: the writer slot's fence, when it is held (:mod:`.writer_slot`)."""
        goal_id = command.goal_id
        for _ in range(MAX_ATTEMPTS):
            state = await self.load(goal_id)
            events = decide(command, state, await self.facts(state, command))
            if not events:
                return []
            if not slot and takes_writer_slot(command, state, events):  # decide again holding the slot
                async with writer_slot(self.store, self.clock) as fence:
                    return await self._execute(command, ctx, event_id, (fence,))
            try:
                batch = self._batch(events, ctx, event_id)
                return await self._store_goal(goal_id, events, batch, state.version, slot)
            except WrongExpectedVersionError:
                self._cache.pop(goal_id, None)
        raise ConflictError(
            f"goal {goal_id} changed {MAX_ATTEMPTS} times while {type(command).__name__} was being decided; "
            "retry the command"
        )

    async def execute_with(
        self, command: c.GoalCommand, ctx: Ctx, companion: Companion
    ) -> tuple[list[Envelope], list[Envelope]]:
        """:meth:`execute`, writing ``companion(decided events)`` (another stream's events) in the same append.

        The goal's events and the companion's land together or not at all (``append_many``), so a crash can
        never record a decision without the saga step that made it. Returns both streams' envelopes.
        """
        return await self._execute_with(command, ctx, companion, ())

    async def _execute_with(
        self, command: c.GoalCommand, ctx: Ctx, companion: Companion, slot: tuple[Fence, ...]
    ) -> tuple[list[Envelope], list[Envelope]]:
        goal_id = command.goal_id
        for _ in range(MAX_ATTEMPTS):
            state = await self.load(goal_id)
            events = decide(command, state, await self.facts(state, command))
            extra = companion(events) if events else None
            if extra is None:
                return await self._execute(command, ctx, None, slot), []
            if not slot and takes_writer_slot(command, state, events):
                async with writer_slot(self.store, self.clock) as fence:
                    return await self._execute_with(command, ctx, companion, (fence,))
            stream, more, expected = extra
            link = {"causation_id": ctx.causation_id, "correlation_id": ctx.correlation_id}
            writes = [
                (goal_stream(goal_id), [new_event(ctx.stamp(e), **link) for e in events], state.version),
                (stream, [new_event(ctx.stamp(e), **link) for e in more], expected),
            ]
            crashpoint(f"before append {goal_stream(goal_id)} + {stream}")
            try:
                recorded, other = await self.store.append_many(
                    writes, fences=(*self.fence_for(goal_id), *slot)
                )
            except WrongExpectedVersionError as e:
                self._cache.pop(goal_id, None)
                if e.stream != goal_stream(goal_id):
                    raise
                continue
            crashpoint(f"after append {goal_stream(goal_id)} + {stream}")
            self._cache.pop(goal_id, None)
            return recorded, other
        raise ConflictError(
            f"goal {goal_id} changed {MAX_ATTEMPTS} times while {type(command).__name__} was being decided; "
            "retry the command"
        )

    async def execute_chain(
        self, commands: Sequence[c.GoalCommand], then: FollowUp, ctx: Ctx
    ) -> tuple[list[list[Envelope]], list[Envelope]]:
        """Decide ``commands`` in turn, each on the state the previous ones' events leave, then the command
        ``then`` makes of that state, and append all of it in one commit.

        One commit where a flow would make several in a row (a confirmed turn, its usage and the next run's
        start): one sync instead of three, and no moment where the log holds only the first half. The
        follow-up's events are caused by the last event the commands decided. ``then`` is asked only when the
        last command decided something; when it answers ``None`` or its command breaks a rule, the commands'
        events are appended alone (the caller takes its ordinary path, which raises that rule's error there).
        Returns each command's envelopes, and the follow-up's.

        :raises DomainError: when one of ``commands`` breaks a rule (nothing is appended).
        :raises ConflictError: when the goal kept changing for :data:`MAX_ATTEMPTS` attempts.
        """
        if not commands:
            raise ValueError("a chain needs at least one command")
        goal_id = commands[0].goal_id
        if any(command.goal_id != goal_id for command in commands):
            raise ValueError("a chain decides commands about one goal")
        for _ in range(MAX_ATTEMPTS):
            state = await self.load(goal_id)
            after, decided = state, []
            for command in commands:
                events = decide(command, after, await self.facts(after, command))
                after = fold(events, after)
                decided.append(events)
            if not any(decided):
                return [[] for _ in commands], []
            follow = await then(after, decided[-1]) if decided[-1] else None
            more: list[Event] = []
            if follow is not None:
                try:
                    more = decide(follow, after, await self.facts(after, follow))
                except DomainError:
                    more = []
            events = [e for part in decided for e in part]
            batch = self._batch(events, ctx, None)
            if more:
                batch += self._batch(more, ctx.caused_by(batch[-1].event_id), None)
            try:
                recorded = await self._store_goal(goal_id, [*events, *more], batch, state.version)
            except WrongExpectedVersionError:
                self._cache.pop(goal_id, None)
                continue
            parts, at = [], 0
            for part in decided:
                parts.append(recorded[at : at + len(part)])
                at += len(part)
            return parts, recorded[at:]
        raise ConflictError(
            f"goal {goal_id} changed {MAX_ATTEMPTS} times while {type(commands[-1]).__name__} was being "
            "decided; retry the command"
        )

    @staticmethod
    def _batch(events: Sequence[Event], ctx: Ctx, event_id: str | None) -> list[NewEvent]:
        """Decided events as the log takes them, with the flow's causal links; each has its event id already,
        so a follow-up can name its cause before anything is appended."""
        if event_id is not None and len(events) != 1:
            raise ValueError(f"an event id names one decided event, not {len(events)}")
        link = {"causation_id": ctx.causation_id, "correlation_id": ctx.correlation_id}
        if event_id is not None:
            return [new_event(ctx.stamp(events[0]), event_id=event_id, **link)]
        return [new_event(ctx.stamp(e), **link) for e in events]

    async def _append_goal(
        self, goal_id: str, events: Sequence[Event], ctx: Ctx, expected: int, event_id: str | None
    ) -> list[Envelope]:
        """Append decided events to the goal's stream and fold them into the cached state."""
        return await self._store_goal(goal_id, events, self._batch(events, ctx, event_id), expected)

    async def _store_goal(
        self, goal_id: str, events: Sequence[Event], batch: list[NewEvent], expected: int,
        slot: tuple[Fence, ...] = (),
    ) -> list[Envelope]:  # fmt: skip
        """Append a built batch to the goal's stream (a crash point on either side) and fold it into the cache;
        ``slot``: the writer slot's fence, when the batch activates a writer."""
        stream = goal_stream(goal_id)
        crashpoint(f"before append {stream} {','.join(e.event_type for e in events)}")
        recorded = await self.store.append(stream, batch, expected, fences=(*self.fence_for(goal_id), *slot))
        crashpoint(f"after append {stream}")
        cached = self._cache.get(goal_id)
        if cached is not None and recorded and recorded[0].version == cached.version + 1:
            for envelope in recorded:
                cached = evolve(cached, envelope)
            self._cache[goal_id] = cached
        else:
            self._cache.pop(goal_id, None)
        return recorded

    async def append(
        self,
        stream: str,
        events: Sequence[Event],
        ctx: Ctx,
        *,
        for_goal: str | None,
        expected: ExpectedVersion = ANY,
    ) -> list[Envelope]:
        """Append payloads to any stream with the flow's causal links (a crash point on either side).

        ``for_goal`` names the goal the write is about (it carries that goal's fences), or ``None`` for a
        write about no goal; there is no default, so no write about a goal goes out unfenced by omission.
        """
        batch = [
            new_event(ctx.stamp(e), causation_id=ctx.causation_id, correlation_id=ctx.correlation_id)
            for e in events
        ]
        fences = self.fence_for(for_goal) if for_goal is not None else ()
        crashpoint(f"before append {stream} {','.join(e.event_type for e in events)}")
        recorded = await self.store.append(stream, batch, expected, fences=fences)
        crashpoint(f"after append {stream}")
        return recorded

    def forget(self, goal_id: str) -> None:
        """Drop the cached state of a goal (the next :meth:`load` folds its stream from the start)."""
        self._cache.pop(goal_id, None)
