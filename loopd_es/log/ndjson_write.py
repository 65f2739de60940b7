"""Turning a group of append requests into the bytes of one NDJSON write and its index records.

Pure staging: nothing here touches the log file. The caller holds the writers' lock, hands in the
stream versions it knows and a retry check, writes :attr:`Staged.data` durably and only then applies
:attr:`Staged.accepted`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

from ..errors import LoopdError
from ..events.envelope import ENVELOPE_ENCODER, Envelope, now_rfc3339
from .base import SequenceChecker, check_expected_version
from .ndjson_files import RECORD, StreamNames, event_id_key

if TYPE_CHECKING:
    from .group_commit import Request

FindRetry = Callable[["Request", list[int], dict[int, Envelope]], "list[Envelope] | None"]


class Staged:
    """The bytes and index records of the accepted requests of one group, and what to acknowledge."""

    __slots__ = ("accepted", "data", "end", "head", "records")

    def __init__(self) -> None:
        self.data = b""
        self.records = b""
        self.head = 0
        self.end = 0
        self.accepted: list[tuple[Request, list[Envelope], list[int]]] = []


def stage_group(
    group: list[Request],
    head: int,
    end: int,
    versions: dict[str, int],
    names: StreamNames,
    find_retry: FindRetry,
) -> Staged:
    """Check and encode every request of ``group``; a failed check sets that request's error or retry result."""
    recorded_at = now_rfc3339()
    buffer = bytearray()
    records = bytearray()
    staged_versions: dict[str, int] = {}
    staged: dict[int, Envelope] = {}
    out = Staged()
    encode = ENVELOPE_ENCODER.encode
    Raw = msgspec.Raw
    pack = RECORD.pack
    position = head
    offset = end
    for request in group:
        keys = [event_id_key(new.event_id) for new in request.events]
        try:
            originals = find_retry(request, keys, staged)
            if originals is not None:
                request.result = originals
                continue
            stream = request.stream
            version = staged_versions.get(stream, versions.get(stream, 0))
            check_expected_version(stream, request.expected, version)
        except LoopdError as e:
            request.error = e
            continue
        number = names.number(stream)
        if number is None:
            number = names.add(stream)
        envelopes = []
        for new, key in zip(request.events, keys, strict=True):
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
                Raw(new.data_bytes()),
            )
            line = encode(env) + b"\n"
            buffer += line
            records += pack(offset, len(line), number, version, key)
            offset += len(line)
            envelopes.append(env)
        staged.update(zip(keys, envelopes, strict=True))
        staged_versions[stream] = version
        out.accepted.append((request, envelopes, keys))
    out.data, out.records, out.head, out.end = bytes(buffer), bytes(records), position, offset
    return out


def stage_import(
    batch: list[Envelope], checker: SequenceChecker, names: StreamNames, offset: int
) -> tuple[bytes, bytes]:
    """The bytes and index records of copied envelopes that start at byte ``offset``, checked for gaps."""
    buffer = bytearray()
    records = bytearray()
    for env in batch:
        checker.check(env)
        number = names.number(env.stream)
        if number is None:
            number = names.add(env.stream)
        line = ENVELOPE_ENCODER.encode(env) + b"\n"
        records += RECORD.pack(
            offset + len(buffer), len(line), number, env.version, event_id_key(env.event_id)
        )
        buffer += line
    return bytes(buffer), bytes(records)
