"""Folding streams of any kind, purely: the reducer of each stream kind, and folds fed a batch at a time.

:mod:`loopd_es.replay` reads the log and feeds these; nothing here does I/O. Each stream kind has a
:class:`Reducer`; a stream of an unknown kind is still folded into an :class:`OtherState` (a count), so a
replay never refuses a log. A reducer folds through a :class:`Folder`, a fold in progress that lives as long
as the replay, so a long stream's state is not rebuilt for every event or batch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeGuard, runtime_checkable

import msgspec

from ..clock import parse_rfc3339
from ..errors import InvalidEventError
from ..events.catalogue import decode_payload
from ..events.imported import CONTROL_PREFIX, STREAM_PREFIX
from .evolve import GoalFold
from .evolve import initial as goal_initial
from .imported_state import ControlState, ImportState, control_step, import_step
from .state import REDUCER_VERSION, GoalState
from .streams import aggregate_of

if TYPE_CHECKING:
    from ..events.envelope import Foldable, LogRow, Payload, StreamRows

_PAYLOAD: Final = itemgetter(1, 2, 3)
"""A whole-log row's type, schema version and payload: the row a fold of one stream takes."""


class Folder(Protocol):
    """A fold in progress: ``apply`` envelopes in order, then take the ``result`` (and maybe go on)."""

    def apply(self, items: Iterable[Foldable]) -> None: ...

    def result(self) -> Any: ...


def _takes_rows(folder: Folder) -> TypeGuard[RowFolder]:
    """Whether ``folder`` is a :class:`RowFolder`, decided once per folder class: ``isinstance`` against a
    runtime-checkable protocol inspects the class every time (about 13 µs, a tenth of a 100-event goal's fold)."""
    kind = type(folder)
    takes = _ROW_FOLDER_TYPES.get(kind)
    if takes is None:
        takes = _ROW_FOLDER_TYPES[kind] = isinstance(folder, RowFolder)
    return takes


_ROW_FOLDER_TYPES: Final[dict[type, bool]] = {}

HELD_EVENTS: Final = 32_768
"""Events a :class:`LogFold` holds, grouped by stream, before it folds them (memory: that many rows)."""


@runtime_checkable
class RowFolder(Folder, Protocol):
    """A :class:`Folder` that also folds a stream's events as rows (:class:`~loopd_es.events.envelope.StreamRows`)."""

    def apply_rows(self, first_version: int, rows: Iterable[Payload], last_position: int) -> None: ...

    def moved_to(self, version: int, position: int) -> None:
        """Where the stream stands after rows whose last place was not known when they were applied."""


class OtherState(msgspec.Struct, frozen=True, kw_only=True):
    """A stream of a kind no reducer knows: how many events, the last type."""

    stream: str
    version: int = 0
    events: int = 0
    last_type: str | None = None


class Reducer(msgspec.Struct, frozen=True, kw_only=True):
    """How to fold one kind of stream: ``initial(aggregate id)``, ``start(state) -> Folder``, ``summary``."""

    kind: str
    version: int
    state_type: Any
    initial: Callable[[str], Any]
    start: Callable[[Any], Folder]
    summary: Callable[[str, Any], str]


class _EachFold:
    """A :class:`Folder` over a reducer that applies one envelope at a time (``step(state, env) -> state``)."""

    __slots__ = ("state", "step")

    def __init__(self, step: Callable[[Any, Foldable], Any], state: Any) -> None:
        self.step = step
        self.state = state

    def apply(self, items: Iterable[Foldable]) -> None:
        state, step = self.state, self.step
        for env in items:
            state = step(state, env)
        self.state = state

    def result(self) -> Any:
        return self.state


def _other_step(state: OtherState, env: Foldable) -> OtherState:
    return OtherState(stream=state.stream, version=env.version, events=state.events + 1, last_type=env.type)


def _goal_summary(stream: str, state: GoalState) -> str:
    return state.summary()


REDUCERS: Final[dict[str, Reducer]] = {
    "goal": Reducer(
        kind="goal",
        version=REDUCER_VERSION,
        state_type=GoalState,
        initial=goal_initial,
        start=GoalFold,
        summary=_goal_summary,
    ),
    "other": Reducer(
        kind="other",
        version=1,
        state_type=OtherState,
        initial=lambda s: OtherState(stream=s),
        start=lambda state: _EachFold(_other_step, state),
        summary=lambda stream, s: f"{stream}: {s.events} events, last {s.last_type}",
    ),
}


def _register_command_reducer() -> None:
    """Fold ``command-*`` streams with the command domain when it is installed (it lands separately)."""
    try:
        module = importlib.import_module(f"{__package__}.command")
    except ModuleNotFoundError:
        return
    evolve_cmd = module.evolve

    def step(state: Any, env: Foldable) -> Any:
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
        kind="command",
        version=4,  # 2: awaits keep their owner session and request time; 3: times are datetimes;
        # 4: an exit records a suspended watch's dropped lines
        state_type=module.CommandState | None,
        initial=lambda _id: None,
        start=lambda state: _EachFold(step, state),
        summary=summary,
    )


_register_command_reducer()


def _each(kind: str, state_type: Any, step: Callable[[Any, Foldable], Any], **kw: Any) -> Reducer:
    """A version-1 reducer that folds one envelope at a time with ``step``."""
    return Reducer(
        kind=kind, version=1, state_type=state_type, start=lambda state: _EachFold(step, state), **kw
    )


REDUCERS["import"] = _each(
    "import",
    ImportState,
    import_step,
    initial=lambda i: ImportState(import_id=i),
    summary=lambda stream, s: (
        f"import {s.import_id} of {s.directory or '?'}: state.json v{s.state_version}"
        + (f" (read as v{s.migrated_version})" if s.migrated_version else "")
        + f", revision {s.state_revision}, "
        + ("completed" if s.completed else "not completed")
        + (f", {len(s.dropped_fields)} field(s) not kept" if s.dropped_fields else "")
    ),
)
REDUCERS["control"] = _each(
    "control",
    ControlState,
    control_step,
    initial=lambda i: ControlState(request_id=i),
    summary=lambda stream, s: (
        f"control request {s.request_id} {s.command!r}: {s.outcome or 'requested'}"
        + (f", goal {s.goal_id}" if s.goal_id else "")
    ),
)


def reducer_versions() -> dict[str, int]:
    """Every reducer's version, the key of the snapshot store."""
    return {kind: r.version for kind, r in REDUCERS.items()}


def reducer_for(stream: str) -> tuple[Reducer, str]:
    """The reducer of ``stream`` and the aggregate id its ``initial`` takes."""
    kind, ident = aggregate_of(stream)
    if kind == "other":  # an import's own streams: not aggregates the engine decides on
        for name, prefix in (("import", STREAM_PREFIX), ("control", CONTROL_PREFIX)):
            if stream.startswith(prefix) and len(stream) > len(prefix):
                return REDUCERS[name], stream[len(prefix) :]
    return REDUCERS.get(kind, REDUCERS["other"]), ident if kind in REDUCERS else stream


class Folded(msgspec.Struct, kw_only=True):
    """One stream's folded state and how it was obtained: the version and position live here, per fold."""

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


def start(stream: str) -> Folded:
    """A stream before its first event."""
    reducer, ident = reducer_for(stream)
    return Folded(stream=stream, kind=reducer.kind, state=reducer.initial(ident))


class Cut:
    """Where a replay stops: after global position ``until``, or after the events recorded at or before ``at``."""

    def __init__(self, until: int | None = None, at: datetime | None = None) -> None:
        self.until = until
        self.at = at

    @property
    def open(self) -> bool:
        return self.until is None and self.at is None

    def passed(self, position: int, recorded_at: str) -> bool:
        """True for an event (or a snapshot) recorded beyond the cut."""
        if self.until is not None and position > self.until:
            return True
        return self.at is not None and parse_rfc3339(recorded_at) > self.at

    def keep(self, batch: Sequence[Foldable]) -> int:
        """How many envelopes at the head of ``batch`` (in log order) come before the cut."""
        if self.open:
            return len(batch)
        for k, env in enumerate(batch):
            if self.passed(env.position, env.recorded_at):
                return k
        return len(batch)


class StreamFold:
    """One stream's fold in progress; its driver feeds it the stream's envelopes in order, a batch at a time."""

    __slots__ = ("_count", "_folder", "_next", "_place", "folded", "unplaced")

    def __init__(self, folded: Folded) -> None:
        self.folded = folded
        self._folder = reducer_for(folded.stream)[0].start(folded.state)
        self._place: tuple[int, int, str] | None = None  # the last event fed: version, position, time
        self._count = 0
        self._next = folded.version + 1  # the version of the next event to feed
        self.unplaced = False  # fed rows whose place is not known yet (:meth:`feed_log_rows`)

    @property
    def takes_rows(self) -> bool:
        """Whether :meth:`feed_rows` may be used: its reducer folds rows (a goal's does)."""
        return _takes_rows(self._folder)

    def feed(self, envelopes: Sequence[Foldable]) -> None:
        if envelopes:
            self._folder.apply(envelopes)
            last = envelopes[-1]
            self._place = (last.version, last.position, last.recorded_at)
            self._count += len(envelopes)
            self._next = last.version + 1

    def feed_rows(self, batch: StreamRows) -> None:
        """Feed the next events as rows (only when :attr:`takes_rows`)."""
        folder = self._folder
        if not _takes_rows(folder):
            raise TypeError(f"the fold of {self.folded.stream!r} does not take rows")
        if batch.rows:
            folder.apply_rows(batch.first_version, batch.rows, batch.last_position)
            self._place = (batch.last_version, batch.last_position, batch.last_recorded_at)
            self._count += len(batch.rows)
            self._next = batch.last_version + 1

    def feed_log_rows(self, rows: Sequence[LogRow]) -> None:
        """Feed the stream's next events as a whole-log read gives them (only when :attr:`takes_rows`): their
        versions counted on from the last fed, their place left for :meth:`place`."""
        folder = self._folder
        if not _takes_rows(folder):
            raise TypeError(f"the fold of {self.folded.stream!r} does not take rows")
        if rows:
            folder.apply_rows(self._next, map(_PAYLOAD, rows), 0)
            self._next += len(rows)
            self._count += len(rows)
            self.unplaced = True

    def place(self, version: int, position: int, recorded_at: str) -> int:
        """Set where the stream stands (its last event fed); returns the version its events counted to, which
        differs from ``version`` only where the stream's versions have a gap (the caller refuses that log)."""
        folder = self._folder
        if _takes_rows(folder):
            folder.moved_to(version, position)
        self._place = (version, position, recorded_at)
        self.unplaced = False
        return self._next - 1

    def result(self) -> Folded:
        """The :class:`Folded` it was given, as of everything fed so far."""
        folded, place = self.folded, self._place
        if place is not None:
            folded.version, folded.position, folded.recorded_at = place
        folded.folded += self._count
        self._count = 0
        folded.state = self._folder.result()
        return folded


class LogFold:
    """Every stream of a log folded at once; its driver feeds it envelopes in global order.

    Envelopes are grouped by stream and each stream's group folded :data:`HELD_EVENTS` at a time (and at
    :meth:`result`), not per read batch: a log of many interleaved streams gives each stream a few events per
    batch, and a fold's call costs more than its few events (a 1000-goal log read 4096 rows at a time made
    25,000 calls of four events each).
    """

    __slots__ = ("_held", "_pending", "_pending_rows", "_streams")

    def __init__(self) -> None:
        self._streams: dict[str, StreamFold] = {}
        self._pending: dict[str, list[Foldable]] = {}
        self._pending_rows: dict[str, list[LogRow]] = {}
        self._held = 0

    def feed(self, envelopes: Sequence[Foldable]) -> None:
        groups = self._pending
        for env in envelopes:  # streams are independent, so each stream's part is folded in one call
            group = groups.get(env.stream)
            if group is None:
                groups[env.stream] = [env]
            else:
                group.append(env)
        self._held += len(envelopes)
        if self._held >= HELD_EVENTS:
            self._fold_pending()

    def feed_rows(self, rows: Sequence[LogRow]) -> None:
        """Feed events of streams whose folds take rows (goals), as a whole-log read gives them
        (:class:`~loopd_es.events.envelope.LogRows`), in log order; :meth:`place` then says where each stands."""
        groups = self._pending_rows
        for row in rows:
            group = groups.get(row[0])
            if group is None:
                groups[row[0]] = [row]
            else:
                group.append(row)
        self._held += len(rows)
        if self._held >= HELD_EVENTS:
            self._fold_pending()

    def place(self, places: dict[str, tuple[int, int, str]]) -> list[str]:
        """Set where each stream fed rows stands (its last event's version, position and time); returns the
        streams whose counted versions do not match (a gap in their versions), and those fed rows but given no
        place. Call it after the last rows."""
        self._fold_pending()
        streams, wrong = self._streams, []
        for stream, (version, position, recorded_at) in places.items():
            folding = streams.get(stream)
            if folding is None or folding.place(version, position, recorded_at) != version:
                wrong.append(stream)
        wrong.extend(s for s, f in streams.items() if f.takes_rows and f.unplaced and s not in places)
        return wrong

    def _fold_pending(self) -> None:
        streams = self._streams
        for stream, group in self._pending.items():
            folding = streams.get(stream)
            if folding is None:
                folding = streams[stream] = StreamFold(start(stream))
            folding.feed(group)
        for stream, rows in self._pending_rows.items():
            folding = streams.get(stream)
            if folding is None:
                folding = streams[stream] = StreamFold(start(stream))
            folding.feed_log_rows(rows)
        self._pending, self._pending_rows, self._held = {}, {}, 0

    def result(self) -> dict[str, Folded]:
        """Every stream fed so far, by name."""
        self._fold_pending()
        return {stream: self._streams[stream].result() for stream in sorted(self._streams)}
