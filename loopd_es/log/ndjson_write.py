"""Turning a group of append requests into the bytes of one NDJSON write and its index records.

Pure staging: nothing here touches the log file. The caller holds the writers' lock, hands in the
stream versions it knows and a retry check, writes :attr:`Staged.data` durably and only then applies
:attr:`Staged.accepted`. Every line of a write but its last ends ``} \\n``, the last ``}\\n``: that is
how a reader of the file alone tells a whole write from an unfinished one (see :mod:`.ndjson_scan`).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

from ..clock import now_rfc3339
from ..errors import LoopdError
from ..events.envelope import ENVELOPE_ENCODER, Envelope
from .base import check_expected_version
from .ndjson_files import StreamNames, event_id_key, id_time
from .ndjson_index import PREFIX, seal

if TYPE_CHECKING:
    from .group_commit import Request
    from .invariants import SequenceChecker

FindRetry = Callable[["Request", list[int], dict[int, Envelope]], "list[Envelope] | None"]
StreamHead = Callable[[str], tuple[int, int]]
"""A stream's (version, position of its last event), (0, 0) for a new one."""
Fields = tuple[int, int, int, int, int, int, int, int]
"""offset, length, stream number, version, event-id key, previous position of the stream, max id time, line CRC"""


class Staged:
    """The bytes and index records of the accepted requests of one group, and what to acknowledge."""

    __slots__ = ("accepted", "chain", "data", "end", "fields", "head", "max_time", "records")

    def __init__(self) -> None:
        self.data = b""
        self.records = b""
        self.fields: list[Fields] = []
        self.chain = 0
        self.max_time = 0
        self.head = 0
        self.end = 0
        self.accepted: list[tuple[Request, list[Envelope], list[int]]] = []


def stage_group(
    group: list[Request],
    head: int,
    end: int,
    chain: int,
    max_time: int,
    stream_head: StreamHead,
    names: StreamNames,
    find_retry: FindRetry,
) -> Staged:
    """Check and encode every request of ``group``; a failed check sets that request's error or retry result.

    ``chain`` is the index chain value of record ``head``; ``max_time`` is the largest UUIDv7 order (see
    :func:`~.ndjson_files.id_time`) of every recorded id and every id of the group, which every record of
    the group carries (an upper bound is all the first-append check needs).
    """
    if len(group) == 1 and len(group[0].parts) == 1 and len(group[0].events) == 1:
        return _stage_one(group[0], head, end, chain, max_time, stream_head, names, find_retry)
    recorded_at = now_rfc3339()
    bodies: list[bytes] = []
    meta: list[tuple[int, int, int, int, int]] = []
    staged_heads: dict[str, tuple[int, int]] = {}
    staged: dict[int, Envelope] = {}
    out = Staged()
    encode = ENVELOPE_ENCODER.encode
    Raw = msgspec.Raw
    position = head
    for request in group:
        keys = [event_id_key(new.event_id) for new in request.all_events]
        try:
            originals = find_retry(request, keys, staged)
            if originals is not None:
                request.result = originals
                continue
            start: dict[str, tuple[int, int]] = {}
            for part in request.parts:  # every part's check before any part is staged: all or none
                head_of = staged_heads.get(part.stream) or stream_head(part.stream)
                start[part.stream] = head_of
                check_expected_version(part.stream, part.expected, head_of[0])
        except LoopdError as e:
            request.error = e
            continue
        envelopes = []
        next_key = iter(keys).__next__
        for stream, events, _expected, payloads in request.parts:
            number = names.number(stream)
            if number is None:
                number = names.add(stream)
            version, last = start[stream]
            for new, data in zip(events, payloads, strict=True):
                position += 1
                version += 1
                env = Envelope(  # positional: this is the hot path
                    position,
                    stream,
                    version,
                    new.event_id,
                    new.type,
                    new.schema_version,
                    recorded_at,
                    new.causation_id,
                    new.correlation_id,
                    Raw(data),
                )
                bodies.append(encode(env))
                meta.append((number, version, next_key(), last, max_time))
                last = position
                envelopes.append(env)
            staged_heads[stream] = (version, last)
        staged.update(zip(keys, envelopes, strict=True))
        out.accepted.append((request, envelopes, keys))
    if not bodies:
        return out
    out.data = b" \n".join(bodies) + b"\n"
    out.fields = _fields(bodies, meta, end)
    out.records, out.chain = seal([PREFIX.pack(*f) for f in out.fields], chain)
    out.head, out.end, out.max_time = position, end + len(out.data), max_time
    return out


def _stage_one(
    request: Request,
    head: int,
    end: int,
    chain: int,
    max_time: int,
    stream_head: StreamHead,
    names: StreamNames,
    find_retry: FindRetry,
) -> Staged:
    """:func:`stage_group` for the commonest group, one request of one event, without the general bookkeeping."""
    out = Staged()
    new = request.events[0]
    key = event_id_key(new.event_id)
    stream = request.stream
    try:
        originals = find_retry(request, [key], {})
        if originals is not None:
            request.result = originals
            return out
        version, last = stream_head(stream)
        check_expected_version(stream, request.expected, version)
    except LoopdError as e:
        request.error = e
        return out
    number = names.number(stream)
    if number is None:
        number = names.add(stream)
    env = Envelope(
        head + 1, stream, version + 1, new.event_id, new.type, new.schema_version, now_rfc3339(),
        new.causation_id, new.correlation_id, msgspec.Raw(request.payloads[0]),
    )  # fmt: skip
    body = ENVELOPE_ENCODER.encode(env)
    fields = (end, len(body) + 1, number, version + 1, key, last, max_time, zlib.crc32(body))
    out.data = body + b"\n"
    out.fields = [fields]
    out.records, out.chain = seal([PREFIX.pack(*fields)], chain)
    out.head, out.end, out.max_time = head + 1, end + len(out.data), max_time
    out.accepted.append((request, [env], [key]))
    return out


def _fields(bodies: list[bytes], meta: list[tuple[int, int, int, int, int]], offset: int) -> list[Fields]:
    out: list[Fields] = []
    crc = zlib.crc32
    last = len(bodies) - 1
    for i, (body, (number, version, key, prev, max_time)) in enumerate(zip(bodies, meta, strict=True)):
        length = len(body) + (1 if i == last else 2)
        out.append((offset, length, number, version, key, prev, max_time, crc(body)))
        offset += length
    return out


def stage_import(
    batch: list[Envelope],
    checker: SequenceChecker,
    names: StreamNames,
    offset: int,
    chain: int,
    lasts: dict[str, int],
    max_time: int,
) -> tuple[bytes, bytes, int, int]:
    """The bytes, index records, last chain and max id time of copied envelopes that start at byte ``offset``,
    checked for gaps; ``lasts`` (each stream's last position) is updated. Every line ends a write (an import is
    undone as a whole on failure)."""
    if not batch:
        return b"", b"", chain, max_time
    bodies: list[bytes] = []
    prefixes = []
    crc = zlib.crc32
    for env in batch:
        checker.check(env)
        number = names.number(env.stream)
        if number is None:
            number = names.add(env.stream)
        body = ENVELOPE_ENCODER.encode(env)
        bodies.append(body)
        max_time = max(max_time, id_time(env.event_id))
        key = event_id_key(env.event_id)
        prev = lasts.get(env.stream, 0)
        prefixes.append(
            PREFIX.pack(offset, len(body) + 1, number, env.version, key, prev, max_time, crc(body))
        )
        lasts[env.stream] = env.position
        offset += len(body) + 1
    records, chain = seal(prefixes, chain)
    return b"\n".join(bodies) + b"\n", records, chain, max_time
