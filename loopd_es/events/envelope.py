"""The envelope: what the log stores around every event, and what an append asks for.

On disk (NDJSON) and on ``loopd-es read --json`` an envelope is one JSON object per line with exactly
these keys, in this order: ``position``, ``stream``, ``version``, ``event_id``, ``type``,
``schema_version``, ``recorded_at``, ``causation_id``, ``correlation_id``, ``data``.

``data`` is kept as :class:`msgspec.Raw` (the payload's JSON bytes) so that readers that only need the
envelope never pay for decoding payloads; :func:`loopd_es.events.decode_payload` turns it into a typed event.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Sequence
from typing import Any, Final, Literal

import msgspec

NO_STREAM: Final = "no_stream"
EXISTS: Final = "exists"
ANY: Final = "any"

ExpectedVersion = int | Literal["no_stream", "exists", "any"]
"""An exact stream version (0 means "no events yet"), or one of ``no_stream``, ``exists``, ``any``."""


class Envelope(msgspec.Struct, frozen=True):
    """One recorded event: its place in the log, its identity, its causal links and its payload."""

    position: int
    stream: str
    version: int
    event_id: str
    type: str
    schema_version: int
    recorded_at: str
    causation_id: str | None
    correlation_id: str | None
    data: msgspec.Raw

    def data_dict(self) -> dict[str, Any]:
        """Decode the payload as a plain JSON object."""
        value = _DICT_DECODER.decode(self.data)
        return value

    def same_content(self, other: NewEvent, stream: str) -> bool:
        """True when ``other`` is an exact retry of this event (same id, stream, type, payload, links)."""
        if (
            self.stream != stream
            or self.type != other.type
            or self.schema_version != other.schema_version
            or self.causation_id != other.causation_id
            or self.correlation_id != other.correlation_id
        ):
            return False
        mine = bytes(self.data)
        theirs = other.data_bytes()
        return mine == theirs or _DICT_DECODER.decode(mine) == _DICT_DECODER.decode(theirs)


class Recorded(msgspec.Struct, frozen=True):
    """The part of an envelope a fold reads: its place, type, schema version, time and payload.

    A replay folds thousands of events and never looks at their ids or causal links; reading rows without
    those three strings makes a replay's read about a fifth cheaper on SQLite (docs/performance.md). ``data``
    is the payload's JSON bytes as stored (no :class:`msgspec.Raw` around them: one object less a row). Every
    :class:`Envelope` has these attributes too (its ``data`` a ``Raw``), so a fold takes either.
    """

    position: int
    stream: str
    version: int
    type: str
    schema_version: int
    recorded_at: str
    data: bytes


Foldable = Envelope | Recorded
"""What the folds of :mod:`loopd_es.domain` take: a whole envelope, or the part of it they read."""

Payload = tuple[str, int, bytes]
"""One event of a :class:`StreamRows` batch: its type, schema version and payload's JSON bytes."""


class StreamRows(msgspec.Struct, frozen=True):
    """A batch of one stream's events as a fold of that stream reads them.

    A fold of one stream reads each event's type, schema version and payload; it needs the version of each
    only to name an anomaly, and the log position and time only of the last (where the fold stands). The
    versions of a stream are contiguous, so ``rows[k]`` is version ``first_version + k``. Fetching only
    these three columns makes a 10k-event replay on SQLite about a fifth faster than :class:`Recorded` rows
    (docs/performance.md, run 10).
    """

    first_version: int
    rows: list[Payload]
    last_position: int
    last_recorded_at: str

    @property
    def last_version(self) -> int:
        """The version of the batch's last event."""
        return self.first_version + len(self.rows) - 1


LogRow = tuple[str, str, int, bytes]
"""One event of a :class:`LogRows` batch read as a row: its stream, type, schema version and payload's JSON bytes."""


class LogRows(msgspec.Struct, frozen=True):
    """A batch of the whole log as a fold of every stream reads it (:meth:`LogStore.read_log_rows`).

    The events of the streams the reader asked for as rows (``rows``: no version, position or time a row, as
    :class:`StreamRows` has none; a stream's versions are contiguous and counted from 1), every other event as
    :class:`Recorded` (``recorded``); each list in log order. A whole-log replay of 1000 goals takes about an
    eighth less time than on :class:`Recorded` rows alone (docs/performance.md). The batch after the last
    event (empty lists) carries ``places``: the version, position and time of each row stream's last event.
    """

    rows: list[LogRow]
    recorded: Sequence[Recorded | Envelope]
    places: dict[str, tuple[int, int, str]] | None = None


class NewEvent(msgspec.Struct, frozen=True, kw_only=True):
    """An event to append. ``data`` is a JSON object: a dict, a payload Struct, or raw JSON bytes."""

    type: str
    data: Any = msgspec.field(default_factory=dict)
    event_id: str = msgspec.field(default_factory=lambda: new_event_id())
    schema_version: int = 1
    causation_id: str | None = None
    correlation_id: str | None = None

    def data_bytes(self) -> bytes:
        """The payload as compact JSON bytes, as it will be stored."""
        data = self.data
        if isinstance(data, msgspec.Raw):
            return bytes(data)
        if isinstance(data, bytes | bytearray | memoryview):
            return bytes(data)
        return _ENCODER.encode(data)


def data_bytes_of(events: Sequence[NewEvent]) -> list[bytes]:
    """:meth:`NewEvent.data_bytes` of each event; a dict payload (the common one) is encoded without the
    method call, which halves the cost of encoding a batch."""
    encode = _ENCODER.encode
    return [encode(data) if type(data := new.data) is dict else new.data_bytes() for new in events]


def new_event_id() -> str:
    """A fresh, time-ordered UUID (version 7, RFC 9562) string.

    Time-ordered ids land at the right edge of the log's unique event-id index, so a commit touches a
    few index pages instead of one random page per event (about 3x faster batch appends on SQLite).
    """
    global _last_ms, _counter
    ms = time.time_ns() // 1_000_000
    if ms <= _last_ms:  # same millisecond (or clock step back): keep ids increasing with a counter
        ms = _last_ms
        _counter += 1
        if _counter > 0xFFF:
            ms += 1
            _counter = 0
    else:
        _counter = 0
    _last_ms = ms
    rand = _rng.getrandbits(62) | 0x8000_0000_0000_0000
    h = f"{(ms << 80) | (0x7000 | _counter) << 64 | rand:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


_last_ms = 0
_counter = 0
# 62 random bits beside the millisecond and counter keep ids unique across processes; a urandom-seeded
# generator gives them without a system call per id, and is re-seeded in forked children.
_rng = random.Random(os.urandom(32))
os.register_at_fork(after_in_child=lambda: _rng.seed(os.urandom(32)))


_ENCODER: Final = msgspec.json.Encoder()
_DICT_DECODER: Final = msgspec.json.Decoder(dict[str, Any])
ENVELOPE_ENCODER: Final = msgspec.json.Encoder()
ENVELOPE_DECODER: Final = msgspec.json.Decoder(Envelope)
