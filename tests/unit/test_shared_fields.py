"""Field lists that must agree: the provider-limit facts of the event, the goal state and the importer.

The event's and the state's times are instants (``UtcTime``, ``datetime``); the importer's reading keeps the
reference's ``lastProviderLimit`` text, so there a time field compares as ``str``.
"""

from __future__ import annotations

from datetime import datetime
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

import msgspec

from loopd_es.domain.state import ProviderLimit
from loopd_es.events.identity import ProviderLimitFacts, ProviderLimitObserved
from loopd_es.importer.source import RefProviderLimit


def _plain(tp: Any, time: Any) -> Any:
    """``tp`` without ``Annotated`` markers (``UtcTime``; the importer marks its time fields for UTC
    normalization), a time as ``time``."""
    if get_origin(tp) is Annotated:
        return _plain(get_args(tp)[0], time)
    if tp is datetime:
        return time
    if get_origin(tp) in (Union, UnionType):
        return Union[tuple(_plain(arg, time) for arg in get_args(tp))]  # noqa: UP007
    return tp


def _fields(cls: type[msgspec.Struct], time: Any = str) -> list[tuple[str, object, object]]:
    return [(f.name, _plain(f.type, time), f.default) for f in msgspec.structs.fields(cls)]


def _as_text(fields: list[tuple[str, object, object]]) -> list[tuple[str, object, object]]:
    """The event's fields as the importer declares them: ``observed_at`` may be null in the event only (an old
    event stored ``""`` for it), the reference's text is ``""`` there."""
    return [(n, str if n == "observed_at" else t, d) for n, t, d in fields]


def test_state_and_event_have_the_same_provider_limit_fields() -> None:
    assert issubclass(ProviderLimit, ProviderLimitFacts)  # one definition of the observation's fields
    assert _fields(ProviderLimit, datetime) == _fields(ProviderLimitFacts, datetime)
    facts = _fields(ProviderLimitFacts)
    assert issubclass(ProviderLimitObserved, ProviderLimitFacts)
    event_only = ("goal_id", "marks_blocker", "via")  # what the event says beyond the observation itself
    assert [f for f in _fields(ProviderLimitObserved) if f[0] not in event_only] == facts


def test_the_importer_reads_the_same_fields_in_camel_case() -> None:
    """msgspec renames only a class's own fields, so the importer's camelCase reading declares them again:
    this keeps the two the same list."""
    assert _fields(RefProviderLimit) == _as_text(_fields(ProviderLimitFacts))
    encoded = {f.encode_name for f in msgspec.structs.fields(RefProviderLimit)}
    assert encoded == {"kind", "source", "observedAt", "model", "statusCode", "retryAt"}
