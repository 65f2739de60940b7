"""The machinery of :mod:`~loopd_es.domain.evolve`: the handler and route tables, the refusal signal, and the
usage watermark memo of one fold. Kept apart so the fold's rules read on their own."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Container
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from ..events.base import payload_decoder
from .state import MAX_ACCOUNTED_IDS, GoalDraft

if TYPE_CHECKING:
    from ..events.base import Event

_Handler = Callable[[GoalDraft, Any, "_Memo"], None]
_HANDLERS: Final[dict[type[Event], _Handler]] = {}


class _Route(NamedTuple):
    """How a stored envelope of one type string is read and applied: one dict lookup per event."""

    schema_version: int
    decode: Callable[[Any], Any]
    handler: _Handler


_ROUTES: Final[dict[str, _Route]] = {}
"""Goal, run and identity type strings to their route; filled at the end of this module."""


class _Refused(Exception):
    """Raised before a handler changes anything, when its event cannot apply; folded as an anomaly."""

    def __init__(self, type_: str, reason: str) -> None:
        self.type_ = type_
        self.reason = reason


class _Memo:
    """Scratch owned by one fold: the usage watermark as a queue of ids and a count per id.

    The state keeps the last 200 accounted message ids as a tuple (what snapshots and ``--json`` show), so
    checking an id against it is a 200-item scan and appending one copies it: that made usage events four times
    dearer than any other. From a fold's second usage event on, the memo holds the watermark instead and
    writes the tuple back once, in :meth:`GoalFold.result`; a single :func:`evolve` never pays for building it.
    """

    __slots__ = ("counts", "dirty", "ids", "order", "uses")

    def __init__(self) -> None:
        self.ids: tuple[str, ...] | None = None
        self.order: deque[str] = deque()
        self.counts: dict[str, int] = {}
        self.dirty = False
        self.uses = 0

    def _live(self, d: GoalDraft) -> bool:
        return self.dirty or d.accounted_message_ids is self.ids

    def seen(self, d: GoalDraft) -> Container[str]:
        """The ids ``d`` has accounted (a tuple built by hand may repeat one, hence counts)."""
        if self._live(d):
            return self.counts
        self.uses += 1
        if self.uses == 1:
            return d.accounted_message_ids
        self.ids = d.accounted_message_ids
        self.order = deque(self.ids)
        self.counts = {}
        for mid in self.ids:
            self.counts[mid] = self.counts.get(mid, 0) + 1
        return self.counts

    def account(self, d: GoalDraft, fresh: tuple[str, ...]) -> None:
        """Append ``fresh`` (none of them seen) and keep the last ``MAX_ACCOUNTED_IDS``."""
        if not self._live(d):
            d.accounted_message_ids = (*d.accounted_message_ids, *fresh)[-MAX_ACCOUNTED_IDS:]
            return
        order, counts = self.order, self.counts
        for mid in fresh:
            order.append(mid)
            counts[mid] = counts.get(mid, 0) + 1
        for _ in range(len(order) - MAX_ACCOUNTED_IDS):
            mid = order.popleft()
            if counts[mid] == 1:
                del counts[mid]
            else:
                counts[mid] -= 1
        self.dirty = True

    def write_back(self, d: GoalDraft) -> None:
        if self.dirty:
            d.accounted_message_ids = self.ids = tuple(self.order)
            self.dirty = False


def _on(cls: type[Event]) -> Callable[[_Handler], _Handler]:
    def register(fn: _Handler) -> _Handler:
        _HANDLERS[cls] = fn
        return fn

    return register


def lazy_route(cls: type[Event], fn: _Handler) -> _Route:
    """A route whose decoder is built at its type's first event, then put in its place: building all of
    them on import cost every CLI start-up tens of milliseconds for types the command never reads."""
    type_, version = cls.event_type, cls.schema_version

    def first(data: Any) -> Any:
        decode = payload_decoder(type_).decode
        _ROUTES[type_] = _Route(version, decode, fn)
        return decode(data)

    return _Route(version, first, fn)
