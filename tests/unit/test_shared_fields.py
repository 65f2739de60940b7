"""Field lists declared once: the provider-limit facts of the event, the goal state and the importer agree."""

from __future__ import annotations

from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

import msgspec

from loopd_es.domain.state import ProviderLimit
from loopd_es.events.identity import ProviderLimitFacts, ProviderLimitObserved
from loopd_es.importer.source import RefProviderLimit


def _plain(tp: Any) -> Any:
    """``tp`` without ``Annotated`` markers (the importer marks its time fields for UTC normalization)."""
    if get_origin(tp) is Annotated:
        return get_args(tp)[0]
    if get_origin(tp) in (Union, UnionType):
        return Union[tuple(_plain(arg) for arg in get_args(tp))]  # noqa: UP007
    return tp


def _fields(cls: type[msgspec.Struct]) -> list[tuple[str, object, object]]:
    return [(f.name, _plain(f.type), f.default) for f in msgspec.structs.fields(cls)]


def test_state_and_event_take_the_provider_limit_fields_from_one_declaration() -> None:
    facts = _fields(ProviderLimitFacts)
    assert issubclass(ProviderLimit, ProviderLimitFacts) and _fields(ProviderLimit) == facts
    assert issubclass(ProviderLimitObserved, ProviderLimitFacts)
    event_only = ("goal_id", "marks_blocker", "via")  # what the event says beyond the observation itself
    assert [f for f in _fields(ProviderLimitObserved) if f[0] not in event_only] == facts


def test_the_importer_reads_the_same_fields_in_camel_case() -> None:
    """msgspec renames only a class's own fields, so the importer's camelCase reading declares them again:
    this keeps the two the same list."""
    assert _fields(RefProviderLimit) == _fields(ProviderLimitFacts)
    encoded = {f.encode_name for f in msgspec.structs.fields(RefProviderLimit)}
    assert encoded == {"kind", "source", "observedAt", "model", "statusCode", "retryAt"}
