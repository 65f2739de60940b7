"""Replay: fold one stream, a goal with everything linked to it, or the whole log, up to a position or time.

The one module of ``domain`` that reads a log, and only through the :class:`~loopd_es.log.base.LogStore`
protocol. Each stream kind has a :class:`Reducer`; a stream of an unknown kind is still folded into a
:class:`OtherState` (a count), so ``replay`` never refuses a log. Snapshots (:mod:`.snapshots`) shortcut
the fold of one stream; snapshot + tail is by construction the same fold as a full replay, and a test
checks it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

import msgspec

from ..errors import InvalidEventError
from ..events.catalogue import decode_payload
from ..events.envelope import Envelope, parse_rfc3339
from .evolve import evolve as goal_apply
from .evolve import initial as goal_initial
from .state import REDUCER_VERSION, GoalState
from .streams import aggregate_of

if TYPE_CHECKING:
    from ..log.base import LogStore
    from .snapshots import SnapshotStore


class OtherState(msgspec.Struct, frozen=True, kw_only=True):
    """A stream of a kind no reducer knows: how many events, the last type."""

    stream: str
    version: int = 0
    events: int = 0
    last_type: str | None = None


class Reducer(msgspec.Struct, frozen=True, kw_only=True):
    """How to fold one kind of stream: ``initial(aggregate id)``, ``apply(state, envelope)``, ``summary``."""

    kind: str
    version: int
    state_type: Any
    initial: Callable[[str], Any]
    apply: Callable[[Any, Envelope], Any]
    summary: Callable[[str, Any], str]


def _other_apply(state: OtherState, env: Envelope) -> OtherState:
    return OtherState(stream=state.stream, version=env.version, events=state.events + 1, last_type=env.type)


def _goal_summary(stream: str, state: GoalState) -> str:
    return state.summary()


REDUCERS: Final[dict[str, Reducer]] = {
    "goal": Reducer(
        kind="goal", version=REDUCER_VERSION, state_type=GoalState, initial=goal_initial,
        apply=goal_apply, summary=_goal_summary,
    ),
    "other": Reducer(
        kind="other", version=1, state_type=OtherState, initial=lambda s: OtherState(stream=s),
        apply=_other_apply, summary=lambda stream, s: f"{stream}: {s.events} events, last {s.last_type}",
    ),
}


def _register_command_reducer() -> None:
    """Fold ``command-*`` streams with the command domain when it is installed (it lands separately)."""
    try:
        module = importlib.import_module(f"{__package__}.command")
    except ModuleNotFoundError:
        return
    evolve_cmd = module.evolve

    def apply(state: Any, env: Envelope) -> Any:
        try:
            event = decode_payload(env)
        except InvalidEventError:
            return state
        return evolve_cmd(state, event, env.version)

    def summary(stream: str, state: Any) -> str:
        if state is None:
            return f"{stream}: no command.started"
        goal = f", goal {state.goal_id}" if getattr(state, "goal_id", None) else ""
        return f"command {state.id} {state.title!r}: {getattr(state, 'status', '?')}{goal}, v{state.version}"

    REDUCERS["command"] = Reducer(
        kind="command", version=1, state_type=module.CommandState | None, initial=lambda _id: None,
        apply=apply, summary=summary,
    )


_register_command_reducer()


def reducer_versions() -> dict[str, int]:
    """Every reducer's version, the key of the snapshot store."""
    return {kind: r.version for kind, r in REDUCERS.items()}


def reducer_for(stream: str) -> tuple[Reducer, str]:
    kind, ident = aggregate_of(stream)
    return REDUCERS.get(kind, REDUCERS["other"]), ident if kind in REDUCERS else stream


class Folded(msgspec.Struct, kw_only=True):
    """One stream's folded state and how it was obtained."""

    stream: str
    kind: str
    state: Any
    version: int = 0
    position: int = 0
    recorded_at: str = ""
    folded: int = 0
    snapshot_version: int | None = None

    def summary(self) -> str:
        reducer, _ = reducer_for(self.stream)
        return reducer.summary(self.stream, self.state)


class _Cut:
    """Where a replay stops: after global ``until`` position, or after events recorded at or before ``at``."""

    def __init__(self, until: int | None, at: datetime | None) -> None:
        self.until = until
        self.at = at

    def passed(self, env: Envelope) -> bool:
        if self.until is not None and env.position > self.until:
            return True
        return self.at is not None and parse_rfc3339(env.recorded_at) > self.at

    @property
    def open(self) -> bool:
        return self.until is None and self.at is None


def start(stream: str) -> Folded:
    reducer, ident = reducer_for(stream)
    return Folded(stream=stream, kind=reducer.kind, state=reducer.initial(ident))


def apply(folded: Folded, env: Envelope, reducer: Reducer) -> None:
    """Fold one envelope into ``folded`` in place (the driver owns it; evolve itself stays pure)."""
    folded.state = reducer.apply(folded.state, env)
    folded.version = env.version
    folded.position = env.position
    folded.recorded_at = env.recorded_at
    folded.folded += 1


async def replay_stream(
    store: LogStore,
    stream: str,
    *,
    until: int | None = None,
    at: datetime | None = None,
    snapshots: SnapshotStore | None = None,
) -> Folded:
    """Fold ``stream`` (from its snapshot when one fits the cut), saving a new snapshot when due.

    :raises StreamNotFoundError: when the stream has no events.
    """
    from ..errors import StreamNotFoundError

    if await store.stream_version(stream) == 0:
        raise StreamNotFoundError(stream)
    cut = _Cut(until, at)
    reducer, _ = reducer_for(stream)
    folded = start(stream)
    snap = snapshots.load(stream) if snapshots is not None else None
    if snap is not None and not (
        (until is not None and snap.position > until) or (at is not None and parse_rfc3339(snap.recorded_at) > at)
    ):
        folded.state = msgspec.msgpack.decode(snap.state, type=reducer.state_type)
        folded.version, folded.position, folded.recorded_at = snap.version, snap.position, snap.recorded_at
        folded.snapshot_version = snap.version
    async for batch in store.read_batches(stream=stream, from_version=folded.version + 1):
        for env in batch:
            if cut.passed(env):
                break
            apply(folded, env, reducer)
        else:
            continue
        break
    since = snap.version if snap else 0
    if snapshots is not None and folded.version - since >= snapshots.every:
        snapshots.save(stream, folded.version, folded.position, folded.recorded_at, folded.state)
    return folded


async def replay_all(store: LogStore, *, until: int | None = None, at: datetime | None = None) -> dict[str, Folded]:
    """Fold every stream of the log in one pass, in global order; returns states by stream name."""
    cut = _Cut(until, at)
    states: dict[str, Folded] = {}
    reducers: dict[str, Reducer] = {}
    async for batch in store.read_batches(limit=until):
        for env in batch:
            if cut.passed(env):
                return states
            folded = states.get(env.stream)
            if folded is None:
                folded = states[env.stream] = start(env.stream)
                reducers[env.stream] = reducer_for(env.stream)[0]
            apply(folded, env, reducers[env.stream])
    return states


async def replay_goal(
    store: LogStore, goal_id: str, *, until: int | None = None, at: datetime | None = None
) -> tuple[Folded, list[Folded]]:
    """A goal's stream and every other stream linked to it (a command started for it or awaited by it)."""
    from .streams import goal_stream

    states = await replay_all(store, until=until, at=at)
    stream = goal_stream(goal_id)
    goal = states.pop(stream, None) or start(stream)
    linked = [f for f in states.values() if _links_to(f.state, goal_id)]
    return goal, linked


def _links_to(state: Any, goal_id: str) -> bool:
    if getattr(state, "goal_id", None) == goal_id:
        return True
    awaits = getattr(state, "awaits", None)
    if isinstance(awaits, dict):
        return goal_id in awaits
    if isinstance(awaits, tuple | list):
        return any(getattr(a, "goal_id", None) == goal_id for a in awaits)
    return False
