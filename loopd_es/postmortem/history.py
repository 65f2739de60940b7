"""A goal's whole timeline: its stream and every linked stream, in global order, with what each event changed.

Events on the goal's own stream are folded with the domain's reducer (:class:`~loopd_es.domain.evolve.GoalFold`)
one at a time, and each is shown as the field-level difference between the goal state before and after it, so
the timeline is the reducer's own account, never a re-interpretation. Events on other streams (switch sagas,
commands) do not change the goal's state; they get a one-line summary of their payload. ``until`` cuts the
timeline at a global position, the way ``loopd-es replay`` cuts a fold.

Time is *effective* time (:func:`loopd_es.events.imported.happened_at`): when the event happened by its
source (an imported event's ``occurred_at``), else when it was recorded. ``at`` keeps the events that had
happened by then, and when a timeline holds imported events its streams are merged by effective time (each
stream keeps its own order), so an imported day reads in the order it happened, not in the order the import
appended its streams. Imported events say where they came from; those synthesised from loopd's
``state.json`` are marked so.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import chain, compress
from operator import attrgetter, is_not
from typing import TYPE_CHECKING, Any, Final

import msgspec
from msgspec.structs import astuple

from ..clock import parse_rfc3339, stamp, stamped_builtins
from ..domain.evolve import GoalFold, initial
from ..domain.state import GoalState
from ..domain.streams import goal_stream, short_id
from ..events.base import Caller
from ..events.imported import Provenance, stamped
from .branches import branch_lines, branches
from .links import of_another_goal

if TYPE_CHECKING:
    from ..domain.reducers import Cut
    from ..events.envelope import Envelope
    from ..log.base import LogStore
    from .links import GoalStreams

_FIELDS: Final = GoalState.__struct_fields__
_SKIPPED: Final = frozenset({"version", "position", "anomaly_count", "anomalies"})
"""Fields every event moves (shown in the envelope) or that a refusal moves (shown as ``refused``)."""
_INDICES: Final = tuple(range(len(_FIELDS)))
_SKIPPED_AT: Final = frozenset(k for k, name in enumerate(_FIELDS) if name in _SKIPPED)
_ANOMALIES: Final = _FIELDS.index("anomaly_count")
_DICT: Final = msgspec.json.Decoder(dict[str, Any])
_ENCODER: Final = msgspec.json.Encoder()
_UNSET: Final = msgspec.UNSET
_SCALARS: Final = frozenset({str, int, float, bool, type(None), datetime})
"""Types :func:`_diff` shows as ``before → after`` without looking inside (when either side is one)."""


class Change(msgspec.Struct, frozen=True, omit_defaults=True):
    """One field of the goal state an event changed; a sequence shows what it gained and lost instead."""

    field: str
    before: Any = msgspec.UNSET
    after: Any = msgspec.UNSET
    added: Any = msgspec.UNSET
    removed: Any = msgspec.UNSET


class Entry:
    """One event of the timeline: its envelope and what it did (``changes`` only on the goal's stream)."""

    __slots__ = ("changes", "envelope", "imported", "occurred_at", "own", "refused", "set_by")

    def __init__(self, envelope: Envelope, own: bool) -> None:
        self.envelope = envelope
        self.own = own
        self.changes: list[Change] = []
        self.refused: str | None = None
        self.set_by: dict[str, Envelope] = {}
        """For each top-level field, the event that last set it *before* this one (only when asked for)."""
        self.occurred_at: str | None = None
        self.imported: Provenance | None = None
        """The source time and provenance of an imported event (read by :func:`_stamp`, per imported stream)."""

    @property
    def at(self) -> str:
        """When the event happened: its source's time when it was imported, else when it was recorded."""
        return self.occurred_at or self.envelope.recorded_at

    @property
    def synthesised(self) -> bool:
        """True for an event an import built from loopd's ``state.json`` (no ledger line records it)."""
        return self.imported is not None and self.imported.synthesised

    def origin(self) -> str | None:
        """Where an imported event came from, in words; ``None`` for an event written by loopd-es itself."""
        return describe_origin(self.imported)

    @property
    def position(self) -> int:
        return self.envelope.position

    def data(self) -> dict[str, Any]:
        return _DICT.decode(self.envelope.data)

    def summary(self) -> str:
        """One line saying what the event says (the changes say what it did)."""
        return summarize(self.envelope.type, self.data())


@dataclass(kw_only=True)
class History:
    """The timeline of one goal, as of the cut."""

    goal_id: str
    streams: tuple[str, ...]
    source: str
    entries: list[Entry]
    state: GoalState
    until: int | None = None
    at: str | None = None

    def by_id(self) -> dict[str, Entry]:
        return {e.envelope.event_id: e for e in self.entries}


async def build_history(
    store: LogStore,
    goal: GoalStreams,
    *,
    until: int | None = None,
    at: datetime | None = None,
    provenance: bool = False,
) -> History:
    """Read the goal's streams, merge them by position, fold the goal's own events and diff each.

    With ``provenance``, every goal event also records which earlier event last set each field
    (:attr:`Entry.set_by`); ``explain`` follows those links, ``history`` does not need them.
    """
    cut = None
    if until is not None:
        from ..domain.reducers import Cut  # only for a cut: the replay's folds are not needed here

        cut = Cut(until, None)
    own = goal_stream(goal.goal_id)
    per_stream = [
        [
            Entry(env, stream == own)
            for env in await _read(store, stream, cut)
            if stream == own or not of_another_goal(env, goal.goal_id)
        ]
        for stream in goal.streams
    ]
    imported = False
    for entries_ in per_stream:
        imported = _stamp(entries_) or imported
    if (
        at is not None
    ):  # what had happened by then: effective time, which imported events do not keep in order
        per_stream = [[e for e in entries_ if _moment(e.at) <= at] for entries_ in per_stream]
    entries: list[Entry] = []
    fold = GoalFold(initial(goal.goal_id))
    state = initial(goal.goal_id)
    before = astuple(state)
    setters: dict[str, Envelope] = {}
    merged: Iterable[Entry]
    if len(per_stream) == 1:
        merged = per_stream[0]
    elif imported:  # the day as it happened: by source time, each stream still in its own order
        merged = heapq.merge(*per_stream, key=_when)
    else:  # sorted runs, which sort merges in C (positions are unique)
        merged = sorted(chain.from_iterable(per_stream), key=_entry_position)
    fields, skipped, scalars, change = _FIELDS, _SKIPPED_AT, _SCALARS, Change  # locals: once per event
    for entry in merged:
        env = entry.envelope
        entries.append(entry)
        if not entry.own:
            continue
        fold.apply((env,))
        state = fold.result()
        after = astuple(state)
        if provenance:
            entry.set_by = dict(setters)
        changes = entry.changes
        # a C-speed scan: most fields are the same object before and after
        for k in compress(_INDICES, map(is_not, before, after)):
            if k in skipped:
                continue
            a, b = before[k], after[k]
            if a != b:
                if type(a) in scalars or type(b) in scalars:  # _diff's usual case, without the call
                    changes.append(change(fields[k], a, b))
                else:
                    _diff(fields[k], a, b, changes)
                if provenance:
                    setters[fields[k]] = env
        if after[_ANOMALIES] != before[_ANOMALIES]:
            entry.refused = state.anomalies[-1].reason if state.anomalies else "refused"
        before = after
    return History(
        goal_id=goal.goal_id,
        streams=goal.streams,
        source=goal.source,
        entries=entries,
        state=state,
        until=until,
        at=at.isoformat() if at is not None else None,
    )


_entry_position: Final = attrgetter("envelope.position")


def _stamp(entries: list[Entry]) -> bool:
    """Read the source time and provenance of a stream's events, if an import wrote the stream.

    An import only writes new streams, so a stream whose first event is not imported has none (checking one
    event instead of every one keeps ``history`` of a native 10k-event goal at its old speed).
    """
    if not entries or stamped(entries[0].envelope.data)[1] is None:
        return False
    for e in entries:
        e.occurred_at, e.imported = stamped(e.envelope.data)
    return True


def _moment(text: str) -> datetime:
    try:
        return parse_rfc3339(text)
    except ValueError:  # an unreadable source time sorts first rather than breaking the timeline
        return datetime.min.replace(tzinfo=UTC)


def _when(entry: Entry) -> tuple[datetime, int]:
    return _moment(entry.at), entry.envelope.position


def describe_origin(imported: Provenance | None) -> str | None:
    """``imported from ledger line 12`` or ``synthesised from state.json: goal.usage (time from goal.updatedAt)``."""
    if imported is None:
        return None
    kind, _, what = imported.source.partition(":")
    if kind == "ledger":
        return f"imported from ledger line {what}"
    time_from = imported.time_from.removeprefix("state:").replace("ledger:", "ledger line ")
    when = (
        "no time of its own: placed after the event before it"
        if time_from == "previous"
        else f"time from {time_from}"
        if time_from
        else "no time in the source"
    )
    return f"synthesised from state.json: {what} ({when})"


async def _read(store: LogStore, stream: str, cut: Cut | None) -> list[Envelope]:
    """One stream's events before the cut (a stream's positions grow with its versions, so stop early)."""
    out: list[Envelope] = []
    async for batch in store.read_batches(stream=stream):
        keep = len(batch) if cut is None else cut.keep(batch)
        out += batch if keep == len(batch) else batch[:keep]
        if keep < len(batch):
            break
    return out


def _diff(path: str, a: Any, b: Any, out: list[Change]) -> None:
    """Append the changes from ``a`` to ``b``: structs field by field, sequences as gains and losses."""
    if type(a) in _SCALARS or type(b) in _SCALARS:  # the usual case, decided without isinstance
        out.append(Change(path, a, b))
        return
    if isinstance(a, msgspec.Struct) and type(a) is type(b):
        for name in a.__struct_fields__:
            x, y = getattr(a, name), getattr(b, name)
            if x is not y and x != y:
                _diff(f"{path}.{name}", x, y, out)
        return
    if isinstance(a, tuple) and isinstance(b, tuple):
        added, removed = _shift(a, b)
        if added or removed:
            out.append(Change(path, added=added or msgspec.UNSET, removed=removed or msgspec.UNSET))
            return
    out.append(Change(path, before=a, after=b))


def _shift(a: tuple[Any, ...], b: tuple[Any, ...]) -> tuple[list[Any], list[Any]]:
    """What ``b`` gained and lost from ``a``; a window that slid or grew (the usual case) costs one compare."""
    if a:
        try:
            k = a.index(b[0]) if b else len(a)
        except ValueError:
            k = -1
        if k >= 0 and a[k:] == b[: len(a) - k]:
            return list(b[len(a) - k :]), list(a[:k])
    old = {_key(x) for x in a}
    new = {_key(y) for y in b}
    return [y for y in b if _key(y) not in old], [x for x in a if _key(x) not in new]


def _key(value: Any) -> Any:
    try:
        hash(value)
    except TypeError:
        return _ENCODER.encode(value)
    return value


# -- words --------------------------------------------------------------------------------------------

_SALIENT: Final[dict[str, tuple[str, ...]]] = {
    "goal.created": ("name",),
    "goal.forked_from": ("source_goal_id", "at_position", "changed"),
    "goal.forked": ("fork_goal_id", "at_position", "changed"),
    "goal.status_changed": ("from", "to", "reason"),
    "goal.blocked": ("reason", "kind"),
    "goal.completed": ("summary", "forced"),
    "goal.progress": ("summary",),
    "goal.budget_exhausted": ("reason",),
    "goal.completion_rejected": ("failure_summary", "rejection_count"),
    "run.started": ("turn_count", "kind", "charged"),
    "run.failed": ("error", "consecutive_failures", "retry_after"),
    "run.fell_back": ("kind", "from_model", "to_model"),
    "identity.switch_requested": ("model", "agent", "reason", "pending"),
    "identity.switch_deferred": ("model", "agent", "reason"),
    "identity.switch_applied": ("target", "from_model", "to_model", "from_agent", "to_agent", "outcome"),
    "identity.switch_failed": ("target", "stage", "reason", "pending"),
    "identity.provider_limit_observed": ("kind", "status_code", "model", "source", "retry_at"),
    "identity.fallback_prepared": ("model", "limit", "attempted"),
    "saga.switch_started": ("model", "agent", "from_model", "from_agent", "pending"),
    "saga.host_call_intended": ("purpose", "op", "arg"),
    "saga.host_call_succeeded": ("result",),
    "saga.host_call_failed": ("reason",),
    "saga.host_call_resolved": ("landed", "live_model", "live_agent"),
    "saga.switch_finished": ("outcome", "recovered"),
    "command.started": ("title", "command"),
    "command.exited": ("status", "end_reason", "exit_code"),
    "command.await-fired": ("status", "exit_code", "until"),
}
_ALWAYS_SUMMARISED: Final = frozenset({"goal.runtime_imported", "goal.budget_exhausted"})
"""Goal events whose payload says more than the state change (an import's kept facts, a budget's limit)."""
_NOISE: Final = frozenset(
    {
        "at",
        "key",
        "owner_pid",
        "session_id",
        "prompt_message_id",
        "message_ids",
        "occurred_at",
        "imported",
        "called_by",
    }
)


_CALLED_VERBS: Final = {
    "goal.created": "created",
    "goal.paused": "paused",
    "goal.resumed": "resumed",
    "goal.retried": "retried",
    "goal.cleared": "cleared",
    "goal.progress": "reported",
    "goal.completion_rejected": "claimed complete",
    "goal.completed": "completed",
    "goal.blocked": "blocked",
    "goal.interactive_changed": "switched to manual or auto",
    "goal.input_queued": "sent",
    "goal.worker_aborted": "aborted",
    "goal.nudged": "nudged",
    "identity.switch_requested": "switch requested",
    "identity.switch_deferred": "switch requested",
    "identity.switch_unsupported": "switch requested",
    "command.started": "started",
    "command.input-written": "typed into",
    "command.resized": "resized",
    "command.watch-set": "watch set",
    "command.watch-suspended": "watch cleared",
    "command.signal-sent": "signalled",
    "command.removed": "removed",
    "command.await-requested": "await requested",
    "command.await-fired": "await fired",
}


def called_by(type_: str, data: dict[str, Any]) -> str | None:
    """``completed by worker session S (call C) with complete_goal, ...`` for an event a tool call caused."""
    found = data.get("called_by")
    if not isinstance(found, dict):
        return None
    try:
        caller = msgspec.convert(found, Caller)
    except msgspec.ValidationError:
        return None
    return caller.describe(_CALLED_VERBS.get(type_, "asked for"))


def summarize(type_: str, data: dict[str, Any]) -> str:
    """``key=value`` for the fields that say what the event is about (ids and timestamps left out)."""
    keys = _SALIENT.get(type_)
    if keys is None:
        keys = tuple(k for k in data if not k.endswith("_id") and k not in _NOISE)
    parts = []
    for k in keys:
        value = data.get(k)
        if value is None or value == "" or value == []:
            continue
        parts.append(f"{k}={show(value, 60)}")
    return " ".join(parts)


def show(value: Any, width: int = 80) -> str:
    """A short, readable rendering of a state or payload value (``-`` for none)."""
    kind = type(value)
    if kind is str:  # the usual case first
        text = value if value and value.isprintable() and " " not in value else repr(value)
        return text if len(text) <= width else text[: width - 1] + "…"
    if value is None:
        return "-"
    if kind is int or kind is float:
        return str(value)
    if kind is bool:
        return "true" if value else "false"
    if kind is datetime:
        return stamp(value)
    if isinstance(value, msgspec.Struct):
        fields = [
            f"{name}: {show(getattr(value, name), width)}"
            for name in value.__struct_fields__
            if getattr(value, name) not in (None, "", (), False)
        ]
        text = "{" + ", ".join(fields) + "}"
    elif isinstance(value, list | tuple):
        text = "[" + ", ".join(show(v, width) for v in value) + "]"
    elif isinstance(value, dict):
        text = "{" + ", ".join(f"{k}: {show(v, width)}" for k, v in value.items()) + "}"
    else:
        text = str(value).lower() if isinstance(value, bool) else str(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def show_change(change: Change, width: int = 80) -> str:
    """``field: before → after``, or ``field: +[gained] -[lost]`` for a sequence."""
    added, removed = change.added, change.removed
    if added is _UNSET and removed is _UNSET:
        return f"{change.field}: {show(change.before, width)} → {show(change.after, width)}"
    parts = []
    if added is not _UNSET:
        parts.append("+" + show(added, width))
    if removed is not _UNSET:
        parts.append("-" + show(removed, width))
    return f"{change.field}: {' '.join(parts)}"


def short_stream(stream: str, goal_id: str) -> str:
    """``goal`` for the goal's own stream, else the stream name cut to its kind and an id prefix."""
    if stream == goal_stream(goal_id):
        return "goal"
    kind, _, ident = stream.partition("-")
    return f"{kind}-{short_id(ident)}" if ident else stream


def short_time(recorded_at: str) -> str:
    """``2026-12-02 12:56:47.123`` from an RFC 3339 time with microseconds."""
    return recorded_at.replace("T", " ").rstrip("Z")[:23]


# -- output -------------------------------------------------------------------------------------------


def render_text(history: History) -> list[str]:
    """The timeline for a terminal: a header, then per event one line and its changes indented below."""
    h, st = history, history.state
    cut = f", cut at position {h.until}" if h.until is not None else (f", cut at {h.at}" if h.at else "")
    if st.exists:
        where = f"{st.name!r}: {st.status}/{st.phase}, model {st.config.model or '-'}, agent {st.config.agent or '-'}"
    else:
        where = "cleared" if st.cleared else "not created yet"
    lines = [f"goal {h.goal_id} {where} — {len(h.entries)} events on {len(h.streams)} streams{cut}"]
    lines.extend(branch_lines(h))
    add = lines.append  # locals: this loop runs once per event (and per change) of the timeline
    indent, unset, goal_id = " " * 8, _UNSET, h.goal_id
    refs = {e.envelope.event_id: e.envelope.position for e in h.entries}
    labels: dict[str, str] = {}  # stream -> its column, padded
    texts: dict[str, str] = {}  # string value -> show(value, 100)
    for e in h.entries:
        env = e.envelope
        label = labels.get(env.stream)
        if label is None:
            label = labels[env.stream] = f"{short_stream(env.stream, goal_id):<15}"
        cause = refs.get(env.causation_id or "")
        because = f"  ← #{cause}" if cause is not None else ""
        when = e.occurred_at or env.recorded_at
        add(  # the time is short_time(when), inlined
            f"#{env.position:<6} {when.replace('T', ' ').rstrip('Z')[:23]}  {label} "
            f"v{env.version:<5} {env.type}{because}"
        )
        if e.imported is not None:
            add(f"{indent}[{e.origin()}]")
        if b'"called_by":{' in bytes(env.data):  # only tool calls' events decode here
            who = called_by(env.type, e.data())
            if who:
                add(f"{indent}{who}")
        if e.refused is not None:
            add(f"{indent}refused by the reducer: {e.refused}")
        if e.own:
            for change in e.changes:
                if change.added is not unset or change.removed is not unset:
                    add(indent + show_change(change, 100))
                    continue
                # show(value, 100) for both sides, with its usual cases inline (strings repeat: memoized)
                a, b = change.before, change.after
                kind = type(a)
                if kind is str:
                    sa = texts.get(a)
                    if sa is None:
                        sa = texts[a] = show(a, 100)
                else:
                    sa = "-" if a is None else str(a) if kind is int else show(a, 100)
                kind = type(b)
                if kind is str:
                    sb = texts.get(b)
                    if sb is None:
                        sb = texts[b] = show(b, 100)
                else:
                    sb = "-" if b is None else str(b) if kind is int else show(b, 100)
                add(f"{indent}{change.field}: {sa} → {sb}")
            if not e.changes and e.refused is None:
                summary = e.summary()
                add(f"{indent}(no change to the goal's state)" + (f" {summary}" if summary else ""))
            elif env.type in _ALWAYS_SUMMARISED:
                add(f"{indent}{e.summary()}")
        else:
            summary = e.summary()
            if summary:
                add(indent + summary)
    return lines


def to_json(history: History) -> dict[str, Any]:
    """The timeline as one JSON document: envelopes with decoded payloads, changes, and the final state."""

    events = []
    for e in history.entries:
        env = e.envelope
        item: dict[str, Any] = {
            "position": env.position,
            "stream": env.stream,
            "version": env.version,
            "type": env.type,
            "recorded_at": env.recorded_at,
            "occurred_at": e.at,
            "event_id": env.event_id,
            "causation_id": env.causation_id,
            "correlation_id": env.correlation_id,
            "data": e.data(),
        }
        if e.own:
            item["changes"] = [stamped_builtins(c) for c in e.changes]
        else:
            item["summary"] = e.summary()
        if e.refused is not None:
            item["refused"] = e.refused
        who = called_by(env.type, item["data"])
        if who:
            item["called_by"] = who
        if e.imported is not None:
            item["imported"] = {**msgspec.to_builtins(e.imported), "synthesised": e.synthesised}
        events.append(item)
    return {
        "goal_id": history.goal_id,
        "streams": list(history.streams),
        "found_by": history.source,
        "until": history.until,
        "at": history.at,
        "status": history.state.status,
        "state": stamped_builtins(history.state),
        "branches": branches(history),
        "events": events,
    }
