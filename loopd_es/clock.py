"""One notion of time: the :class:`Clock` every part asks, and the only conversions between time's shapes.

In memory a point in time is an aware ``datetime`` in UTC. A datetime compares, subtracts and sorts as a
time whatever text it came from, and it is what msgspec, the SQL drivers and the reference's ISO strings map
onto without a unit to remember; integer microseconds would need a conversion at each of those edges
instead. Times cross an edge only through this module:

* text in (events, loopd state files, host payloads): :func:`parse_rfc3339`, which normalizes any offset to
  UTC, so ``12:00+02:00`` is ``10:00Z`` and a deadline already past compares as past;
* text out: :func:`iso` (milliseconds, the reference's form) or :func:`iso_us` (microseconds, the log's);
* epoch numbers (the reference's ``/loop`` fields and tool arguments, OpenCode's ``time.created``):
  :func:`from_ms` / :func:`to_ms`, and :func:`from_us` / :func:`to_us` for coordination records.

Events (:data:`loopd_es.events.times.UtcTime`) and states hold datetimes; text is written only at the edges
that show or store text (:func:`stamp` for read models and ``--json``). The ``/loop`` deciders take a datetime
"now" and do their slot arithmetic (grid, jitter) in integer epoch milliseconds, the reference's unit, converting
back with :func:`from_ms_held`.

Nothing compares two time strings: text is parsed first (a ``+02:00`` string and a ``Z`` string of the same
instant sort apart as text).
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Protocol

import msgspec

EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MS: Final = timedelta(milliseconds=1)
_US: Final = timedelta(microseconds=1)


class Clock(Protocol):
    """Where every part reads the time, so a test can move it by hand."""

    def now(self) -> datetime:
        """The current time, aware, in UTC."""
        ...


class SystemClock:
    """The wall clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)


class FakeClock:
    """A clock that moves only when a test says so."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = utc(start) if start is not None else datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)

    def now(self) -> datetime:
        return self._now

    def advance(self, seconds: float) -> datetime:
        """Move ``seconds`` forward and return the new time."""
        self._now += timedelta(seconds=seconds)
        return self._now

    def advance_ms(self, ms: float) -> datetime:
        """Move ``ms`` milliseconds forward and return the new time."""
        self._now += timedelta(milliseconds=ms)
        return self._now

    def set(self, moment: datetime) -> None:
        """Jump to ``moment`` (either direction: a test of a clock step)."""
        self._now = utc(moment)


WALL: Final = SystemClock()
"""The wall clock, for the parts that are handed no clock (a command's supervisor, a bundle's stamp)."""


def utc(moment: datetime) -> datetime:
    """``moment`` in UTC; a naive datetime is taken as UTC already (as the reference writes its times)."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def parse_rfc3339(text: str) -> datetime:
    """An ISO 8601 / RFC 3339 time (``Z``, an offset, or none meaning UTC) as an aware UTC datetime.

    Raises ``ValueError`` for text that is not a time.
    """
    return utc(datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00")))


_WRITTEN_TO: Final = re.compile(
    r"\s*\d{4}-?\d{2}-?\d{2}(?:[Tt ](\d{2})(?::?(\d{2})(?::?(\d{2})(?:[.,](\d+))?)?)?)?(?:[Zz]|[+-].*)?\s*"
)


def parse_cut(text: str) -> datetime:
    """A cut time (``--at``): the last instant of the unit ``text`` is written to, so that "at or before" takes
    every event of it. ``history`` prints times to the millisecond while events keep microseconds; a cut at a
    printed ``20:59:14.343Z`` left out the event printed there. ``20:59Z`` covers the whole minute, a date the
    whole day; a time written to the microsecond is that instant.

    Raises ``ValueError`` for text that is not a time.
    """
    at = parse_rfc3339(text)
    m = _WRITTEN_TO.fullmatch(text)
    if m is None:
        return at
    hour, minute, second, fraction = m.groups()
    if fraction is not None:
        rest = timedelta(microseconds=10 ** max(6 - len(fraction), 0) - 1)
    elif second is not None:
        rest = timedelta(seconds=1)
    elif minute is not None:
        rest = timedelta(minutes=1)
    elif hour is not None:
        rest = timedelta(hours=1)
    else:
        rest = timedelta(days=1)
    if fraction is None:
        rest -= timedelta(microseconds=1)
    return at + rest


def parse_or_none(text: str | None) -> datetime | None:
    """:func:`parse_rfc3339` of ``text``, ``None`` for absent, empty or unreadable text."""
    if not text:
        return None
    try:
        return parse_rfc3339(text)
    except ValueError:
        return None


def later(text: str | None, than: str | None) -> bool:
    """The time ``text`` names is after the one ``than`` names; ``False`` unless both are readable times."""
    a, b = parse_or_none(text), parse_or_none(than)
    return a is not None and b is not None and a > b


def utc_text(text: str) -> str:
    """``text`` with its instant written in UTC: the normalization at the edge where outside times come in.

    Text already in UTC (``...Z``, as loopd writes every time) is kept byte for byte; an offset (``+02:00``)
    or none is rewritten as :func:`iso` (:func:`iso_us` when it has finer digits); text naming no time is kept
    as it is, for the reader to refuse or show.
    """
    if text.endswith("Z"):
        return text
    moment = parse_or_none(text)
    if moment is None:
        return text
    return iso(moment) if moment.microsecond % 1000 == 0 else iso_us(moment)


def iso(moment: datetime) -> str:
    """``2026-10-07T12:00:00.000Z``: the reference's form (milliseconds, UTC), as its state files and texts show."""
    return _utc_text(moment, "milliseconds")


def iso_ms(ms: float) -> str:
    """Epoch milliseconds as :func:`iso` text: what the reference's ``new Date(ms).toISOString()`` prints."""
    return iso(from_ms(ms))


def iso_us(moment: datetime) -> str:
    """``2026-10-07T12:00:00.123456Z``: the log's form (microseconds, UTC)."""
    return _utc_text(moment, "microseconds")


def _utc_text(moment: datetime, timespec: str) -> str:
    """RFC 3339 UTC text with a ``Z``. Read models write a time this way once an event, so it avoids
    ``strftime`` (twice as slow) and a conversion when the time is UTC already, as decoded ones are."""
    if moment.tzinfo is not UTC:
        moment = utc(moment)
    return moment.isoformat(timespec=timespec)[:-6] + "Z"  # "+00:00"


def display(moment: datetime) -> str:
    """``2026-12-02 13:00:01``: a time in a table (UTC, to the second)."""
    return utc(moment).strftime("%Y-%m-%d %H:%M:%S")


def from_ms(ms: float) -> datetime:
    """Epoch milliseconds (the reference's ``/loop`` fields, OpenCode's ``time.created``) as a UTC datetime."""
    return EPOCH + timedelta(milliseconds=ms)


def to_ms(moment: datetime) -> int:
    """``moment`` as whole epoch milliseconds (floored), exact for any datetime."""
    return (utc(moment) - EPOCH) // _MS


def from_us(us: int) -> datetime:
    """Epoch microseconds (the coordination records' expiry) as a UTC datetime."""
    return EPOCH + timedelta(microseconds=us)


def to_us(moment: datetime) -> int:
    """``moment`` as whole epoch microseconds."""
    return (utc(moment) - EPOCH) // _US


def ms_between(later: datetime, earlier: datetime) -> float:
    """Milliseconds from ``earlier`` to ``later`` (negative when ``later`` is before)."""
    return (later - earlier) / _MS


def now_rfc3339() -> str:
    """The wall clock as :func:`iso_us` text, cheaply: appends stamp many events a second."""
    global _second_cache
    now = time.time()
    second = int(now)
    if _second_cache[0] != second:  # strftime costs microseconds; cache the seconds part
        _second_cache = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
    return f"{_second_cache[1]}.{int((now - second) * 1_000_000):06d}Z"


_second_cache: tuple[int, str] = (-1, "")


def whole_ms(moment: datetime) -> datetime:
    """``moment`` cut to the millisecond, the precision :func:`iso` records.

    Activity handled in an idle candidate's own millisecond came with the idle signal, not after it (OpenCode
    sends a busy status just before its idle pair): compared at microseconds, it would stage the candidate
    again and cost a second quiet period.
    """
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


_FIRST_MS: Final = -62_135_596_800_000
_LAST_MS: Final = 253_402_300_799_999


def from_ms_held(ms: float) -> datetime:
    """Epoch milliseconds as a UTC datetime held within the years a datetime holds (1 to 9999).

    ``/loop`` times are sums of a time and an interval the user or a model chose (``/loop 100000000d``, a
    ``nextDueAtMs`` of 2**53): one past 9999-12-31 means "never, in practice" and is kept as the last
    millisecond a datetime holds rather than refused, like one before year 1 as the first.
    """
    if ms != ms:  # NaN
        raise ValueError("a time in epoch milliseconds must be a number, not NaN")
    return from_ms(max(_FIRST_MS, min(_LAST_MS, ms)))


def iso_held(ms: float) -> str:
    """:func:`iso_us` text of :func:`from_ms_held`: how an old epoch-ms event time is read (upcasting)."""
    return iso_us(from_ms_held(ms))


def stamp(moment: datetime | None) -> str:
    """``moment`` as UTC text where read models and outputs keep text (``""`` for none); states keep the
    datetime itself.

    :func:`iso` when it falls on a whole millisecond (the reference's form, so a time imported from a loopd
    project reads back as it was written there), :func:`iso_us` otherwise (nothing finer is lost).
    """
    if moment is None:
        return ""
    return _utc_text(moment, "microseconds" if moment.microsecond % 1000 else "milliseconds")


def stamp_or_none(moment: datetime | None) -> str | None:
    """:func:`stamp` of ``moment``, ``None`` for none."""
    return None if moment is None else stamp(moment)


def stamp_text(text: str) -> str:
    """A payload's time text as :func:`stamp` writes it (views that read raw payloads show every time alike);
    text naming no time is kept as it is."""
    moment = parse_or_none(text)
    return text if moment is None else stamp(moment)


def stamped_builtins(obj: object) -> Any:
    """``msgspec.to_builtins(obj)`` with every datetime written by :func:`stamp`: the JSON a command prints
    or a tool returns shows a state's times as the read models and the reference do (``...00.000Z``), not in
    msgspec's own form (``...00Z``, ``.123000Z``)."""
    return _stamp_all(msgspec.to_builtins(obj, builtin_types=(datetime,)))


def _stamp_all(value: Any) -> Any:
    if isinstance(value, datetime):
        return stamp(value)
    if isinstance(value, dict):
        return {k: _stamp_all(v) for k, v in value.items()}
    if isinstance(value, list | tuple):  # to_builtins keeps tuples; JSON has lists
        return [_stamp_all(v) for v in value]
    return value
