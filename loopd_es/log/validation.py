"""Checks every backend applies to an append before touching storage."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import msgspec

from ..errors import DuplicateEventIdError, UsageError

if TYPE_CHECKING:
    from ..events.envelope import Envelope, NewEvent


def check_new_events(events: Sequence[NewEvent]) -> None:
    """Refuse a batch with an invalid type, a non-UUID or repeated event id, or a payload that is not an object.

    :raises UsageError: naming the first offending event.
    """
    seen: set[str] = set()
    good_types: set[str] = set()
    match = _UUID.fullmatch
    for i, new in enumerate(events):
        kind = new.type
        if kind not in good_types:
            if not isinstance(kind, str) or "." not in kind or not kind.isprintable() or len(kind) > 200:
                raise UsageError(f"event {i + 1} of the batch: invalid type {kind!r}; "
                                 "types are dotted names like 'goal.created'")
            good_types.add(kind)
        event_id = new.event_id
        if event_id in seen or not isinstance(event_id, str) or match(event_id) is None:
            what = "appears twice in the batch" if event_id in seen else "is not a UUID; omit it to get a fresh one"
            raise UsageError(f"event {i + 1} of the batch: event id {event_id!r} {what}")
        seen.add(event_id)
        if new.schema_version < 1:
            raise UsageError(f"event {i + 1} of the batch: schema_version must be >= 1, got {new.schema_version}")
        data = new.data
        if type(data) is not dict and not isinstance(data, msgspec.Struct):
            if not new.data_bytes().lstrip().startswith(b"{"):
                raise UsageError(f"event {i + 1} of the batch: data must be a JSON object, e.g. {{\"name\": \"x\"}}")


_UUID: Final = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")



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
