"""Checks every backend applies to an append before touching storage."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import msgspec

from ..errors import DuplicateEventIdError, UsageError

if TYPE_CHECKING:
    from ..events.envelope import Envelope, NewEvent


_LINKS: Final = ("causation_id", "correlation_id")
MAX_LINK: Final = 200
"""The longest causal link (an event id, or a caller's own id) an event may carry."""


def check_new_events(events: Sequence[NewEvent]) -> Sequence[NewEvent]:
    """Refuse a batch with an invalid type, a non-UUID or repeated event id, or a payload that is not an object.

    Returns the batch to store: ``events`` itself, or a copy in which raw payload bytes lose their outer
    whitespace and have each inner line break (legal JSON whitespace, but it would split an NDJSON line and
    fool line-based readers) turned into a space, which leaves the JSON value unchanged. So every payload
    that reaches a backend is one JSON object with no raw line break, whatever the caller passed.

    :raises UsageError: naming the first offending event.
    """
    seen: set[str] = set()
    good_types: set[str] = set()
    match = _UUID.fullmatch
    normalised: list[NewEvent] | None = None
    ids_ok = _ids_ok(events)
    for i, new in enumerate(events):
        kind = new.type
        if kind not in good_types:
            if not isinstance(kind, str) or "." not in kind or not kind.isprintable() or len(kind) > 200:
                raise UsageError(
                    f"event {i + 1} of the batch: invalid type {kind!r}; "
                    "types are dotted names like 'goal.created'"
                )
            good_types.add(kind)
        if not ids_ok:
            event_id = new.event_id
            if event_id in seen or not isinstance(event_id, str) or match(event_id) is None:
                what = (
                    "appears twice in the batch"
                    if event_id in seen
                    else "is not a UUID; omit it to get a fresh one"
                )
                raise UsageError(f"event {i + 1} of the batch: event id {event_id!r} {what}")
            seen.add(event_id)
        if new.schema_version < 1:
            raise UsageError(
                f"event {i + 1} of the batch: schema_version must be >= 1, got {new.schema_version}"
            )
        for name in _LINKS:
            link = getattr(new, name)
            # a NUL or a line break stored by one backend would stop an export to another (PostgreSQL text)
            if link is not None and not (
                isinstance(link, str) and 0 < len(link) <= MAX_LINK and link.isprintable()
            ):
                raise UsageError(
                    f"event {i + 1} of the batch: {name} {link!r} must be 1-{MAX_LINK} printable characters"
                )
        data = new.data
        if type(data) is not dict and not isinstance(data, msgspec.Struct):
            raw = _checked_raw(i, new)
            if raw is not None:
                if normalised is None:
                    normalised = list(events[:i])
                normalised.append(msgspec.structs.replace(new, data=msgspec.Raw(raw)))
                continue
        if normalised is not None:
            normalised.append(new)
    return events if normalised is None else normalised


def _ids_ok(events: Sequence[NewEvent]) -> bool:
    """Whether every event id is a distinct UUID, checked for the whole batch at once (C speed); when not,
    the caller checks id by id to name the first bad one."""
    if len(events) == 1:  # most appends: one event, one match
        event_id = events[0].event_id
        return isinstance(event_id, str) and len(event_id) == 36 and _UUID.fullmatch(event_id) is not None
    ids = [new.event_id for new in events]
    try:
        joined = "".join(ids)
    except TypeError:
        return False
    return set(map(len, ids)) <= {36} and _UUIDS.fullmatch(joined) is not None and len(set(ids)) == len(ids)


def _checked_raw(i: int, new: NewEvent) -> bytes | None:
    """Check a payload given as bytes in full; returns its normalised bytes, or None when they need no change.

    :raises UsageError: when the bytes are not exactly one JSON object.
    """
    try:
        raw = new.data_bytes()
        value = _OBJECT.decode(raw)
    except (msgspec.DecodeError, TypeError, ValueError) as e:
        raise UsageError(
            f'event {i + 1} of the batch: data must be one JSON object, e.g. {{"name": "x"}} ({e})'
        ) from e
    if not isinstance(value, dict):
        raise UsageError(f'event {i + 1} of the batch: data must be a JSON object, e.g. {{"name": "x"}}')
    # valid JSON has no raw control character inside a string, so line breaks are whitespace between tokens;
    # the outer whitespace goes too, as a reader of the line would not see it in ``data``
    clean = raw.strip(b" \t\r\n")
    if b"\n" in clean or b"\r" in clean:
        clean = clean.replace(b"\r", b" ").replace(b"\n", b" ")
    return None if clean == raw else clean


_OBJECT: Final = msgspec.json.Decoder()
_UUID_TEXT: Final = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_UUID: Final = re.compile(_UUID_TEXT)
_UUIDS: Final = re.compile(f"(?:{_UUID_TEXT})*")


def resolve_retry(
    stream: str, events: Sequence[NewEvent], originals: Sequence[Envelope | None]
) -> list[Envelope] | None:
    """Decide what to do with a batch given the already-recorded envelope (or None) of each of its ids.

    Returns None when every id is new, the originals when the batch is an exact retry.

    :raises DuplicateEventIdError: for a reused id with other content, or a mix of recorded and new ids.
    """
    found = [env for env in originals if env is not None]
    if not found:
        return None
    for new, env in zip(events, originals, strict=True):
        if env is not None and not env.same_content(new, stream):
            raise DuplicateEventIdError(new.event_id, env.position, env.stream)
    if len(found) < len(originals):
        first = found[0]
        raise DuplicateEventIdError(
            first.event_id, first.position, first.stream, "a batch that mixes recorded and new events"
        )
    return found
