"""Helpers the read models share: grouping a batch by stream, fast payload decoding, and goal folds.

The goal read models reuse the domain's own fold (:class:`~loopd_es.domain.evolve.GoalFold`) instead of
re-implementing its rules, so a row never disagrees with ``loopd-es replay``. The folded state lives in a
table of the projection that folds it (never shared: each projection is rebuilt alone), encoded as msgpack,
and is loaded once and saved once per stream per batch.

Speed (``tools/bench_rebuild.py``): folding is the dearest part of a rebuild, and ``goals`` and ``runs`` fold
the same goal streams. :meth:`GoalFolds.fold` is therefore memoised, as the pure function it is, on
``(goal, the stored state's bytes, the very envelope objects folded)``: when ``runs`` folds the group ``goals``
just folded from an equal stored state, it takes that result instead of folding again. Across batches the
:class:`GoalFold` itself is kept, keyed by the bytes of the state it holds, so the next batch goes on
folding without decoding the stored state (nor rebuilding the fold's usage memo) when the table still holds
exactly those bytes. Both caches are checked against the table on every use, so what a projection writes is
still a pure function of its tables and the events it is given; a rolled-back batch simply misses.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, NamedTuple

import msgspec

from loopd_es.clock import stamp
from loopd_es.domain.streams import GOAL_PREFIX
from loopd_es.events.base import CATALOGUE, payload_decoder
from loopd_es.events.imported import happened_at

if TYPE_CHECKING:
    from loopd_es.domain.evolve import GoalFold
    from loopd_es.domain.state import GoalState
    from loopd_es.events.base import Event
    from loopd_es.events.envelope import Envelope

# The fold (the domain's evolve, the event catalogue) is imported at the first batch to fold, not with the
# module: a query whose read models are caught up (``loopd-es goals``) never folds, and importing it cost
# that start-up a fifth of its time.
_ENCODER: Final = msgspec.msgpack.Encoder()
_DECODER: list[msgspec.msgpack.Decoder[GoalState]] = []
_LIVE_LIMIT: Final = 128  # goals whose fold is kept between batches (the most recently folded); >= 1

Mark = tuple[str | None, int]
"""A goal fold's (active run id, anomaly count): see :meth:`GoalFold.peek`."""


def by_stream(envelopes: Iterable[Envelope], prefix: str) -> dict[str, list[Envelope]]:
    """The envelopes of streams named ``<prefix><id>``, grouped by id, each group in log order.

    Streams are independent, so folding each group in one go gives the rows event-by-event folding would.
    Groups by the whole stream name first (one dict lookup per event) and filters the few names after.
    """
    groups: dict[str, list[Envelope]] = {}
    for env in envelopes:
        group = groups.get(env.stream)
        if group is None:
            groups[env.stream] = [env]
        else:
            group.append(env)
    cut = len(prefix)
    return {s[cut:]: group for s, group in groups.items() if len(s) > cut and s.startswith(prefix)}


_GROUPED: list[tuple[Envelope, Envelope, int, dict[str, list[Envelope]]]] = []
"""The last batch :func:`goal_groups` grouped (its first and last envelope, length, groups): ``goals`` and
``runs`` are given the same batch in turn, so the second one takes the first one's grouping."""


def goal_groups(envelopes: Sequence[Envelope]) -> dict[str, list[Envelope]]:
    """:func:`by_stream` for goal streams (the same batch twice in a row is grouped once; groups are not
    to be changed by the caller)."""
    if not envelopes:
        return {}
    first, last, size = envelopes[0], envelopes[-1], len(envelopes)
    if _GROUPED:
        a, b, n, groups = _GROUPED[0]
        if a is first and b is last and n == size:
            return groups
    groups = by_stream(envelopes, GOAL_PREFIX)
    _GROUPED[:] = [(first, last, size, groups)]
    return groups


def when(at: datetime | str | None, env: Envelope) -> str:
    """The time a payload says it happened, else its source's time (imported), else when the log recorded it.

    Read models keep times as RFC 3339 UTC text: a payload's instant is written with :func:`stamp`."""
    if isinstance(at, datetime):
        return stamp(at)
    return at or happened_at(env)


_ROUTES: dict[str, tuple[int, Callable[[Any], Any]]] = {}


def payload(env: Envelope) -> Event:
    """:func:`decode_payload` without its per-call lookups and copy: the typed decoder straight on the bytes.

    Anything unusual (an unknown type, an older schema version, a payload that does not decode) goes
    through :func:`decode_payload`, which upcasts or raises its usual :class:`InvalidEventError`.
    """
    route = _ROUTES.get(env.type)
    if route is None:
        if env.type not in CATALOGUE:
            return _decode(env)
        route = _ROUTES[env.type] = (CATALOGUE[env.type].schema_version, payload_decoder(env.type).decode)
    if env.schema_version == route[0]:
        try:
            event: Event = route[1](env.data)
            return event
        except msgspec.DecodeError:
            pass
    return _decode(env)


def _decode(env: Envelope) -> Event:
    from loopd_es.events.catalogue import decode_payload

    return decode_payload(env)


class Folded(NamedTuple):
    """One goal's group folded: the state after it, and the fold's :data:`Mark` before and after each event.

    The marks after each event are kept as two flat lists (``runs``, ``anomalies``), not a tuple per event:
    a tuple per event kept alive for the batch was enough to make the garbage collector run noticeably.
    """

    goal_id: str
    group: list[Envelope]
    state: GoalState
    start: Mark
    runs: list[str | None]
    anomalies: list[int]


class _Done(NamedTuple):
    group: list[Envelope]
    blob: bytes
    folded: Folded


_LIVE: dict[str, tuple[bytes, GoalFold]] = {}
"""goal id -> (msgpack of the state a kept fold holds, the fold): continued when the table holds those bytes."""
_DONE: dict[tuple[str, bytes | None], _Done] = {}
"""(goal id, stored state bytes before) -> the fold of a group from that state (checked by envelope identity).

Holds one batch only: keeping older envelopes alive would only make the garbage collector slower."""
_LAST: list[Envelope | None] = [None]  # the last envelope of the groups folded last: marks the batch


def _traced(
    fold: GoalFold, group: Sequence[Envelope], runs: list[str | None], anomalies: list[int]
) -> Iterator[Envelope]:
    """Feed ``group`` to one ``fold.apply`` call, noting the fold's mark after each event (no state copies)."""
    add_run, add_count = runs.append, anomalies.append
    for env in group:
        yield env
        run, count = fold.peek()
        add_run(run)
        add_count(count)


def _same(a: Sequence[Envelope], b: Sequence[Envelope]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


class GoalFolds:
    """Each goal's folded :class:`GoalState`, kept in ``table`` (goal_id -> msgpack state)."""

    def __init__(self, table: str) -> None:
        self.table = table
        self._select = f"SELECT state FROM {table} WHERE goal_id = ?"
        self._save = f"INSERT OR REPLACE INTO {table} (goal_id, state) VALUES (?, ?)"

    def schema(self, conn: sqlite3.Connection) -> None:
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {self.table} (goal_id TEXT PRIMARY KEY, state BLOB NOT NULL) WITHOUT ROWID"
        )

    def reset(self, conn: sqlite3.Connection) -> None:
        conn.execute(f"DROP TABLE IF EXISTS {self.table}")

    def fold(self, conn: sqlite3.Connection, groups: dict[str, list[Envelope]]) -> list[Folded]:
        """Fold each goal's group from its stored state and store the new states: one read, one write each."""
        from loopd_es.domain.evolve import GoalFold, initial

        if not _DECODER:
            from loopd_es.domain.state import GoalState

            _DECODER.append(msgspec.msgpack.Decoder(GoalState))
        decoder = _DECODER[0]
        select = self._select
        if groups:  # a new batch (another last event) drops the groups of the previous one: they are done
            last = next(reversed(groups.values()))[-1]
            if _DONE and _LAST[0] is not last:
                _DONE.clear()
            _LAST[0] = last
        done: list[Folded] = []
        saves: list[tuple[str, bytes]] = []
        for goal_id, group in groups.items():
            row = conn.execute(select, (goal_id,)).fetchone()
            blob: bytes | None = None if row is None else row[0]
            hit = _DONE.get((goal_id, blob))
            if hit is not None and _same(hit.group, group):
                done.append(hit.folded._replace(group=group))
                saves.append((goal_id, hit.blob))
                continue
            kept = _LIVE.pop(goal_id, None)
            if kept is not None and kept[0] == blob:
                folding = kept[1]
            else:
                folding = GoalFold(initial(goal_id) if blob is None else decoder.decode(blob))
            start = folding.peek()
            runs: list[str | None] = []
            anomalies: list[int] = []
            folding.apply(_traced(folding, group, runs, anomalies))
            state = folding.result()
            after = _ENCODER.encode(state)
            folded = Folded(goal_id, group, state, start, runs, anomalies)
            if len(_LIVE) >= _LIVE_LIMIT:  # drop the least recently folded: goals that finished long ago
                del _LIVE[next(iter(_LIVE))]
            _LIVE[goal_id] = (after, folding)
            _DONE[(goal_id, blob)] = _Done(group, after, folded)
            done.append(folded)
            saves.append((goal_id, after))
        conn.executemany(self._save, saves)
        return done


def json_list(items: Sequence[str]) -> str:
    """A list stored in one column, as JSON text."""
    return msgspec.json.encode(list(items)).decode()
