"""Upcasters: how an event stored with an old ``schema_version`` is read as the current payload.

Stored events are never rewritten. When a payload change cannot be absorbed by a defaulted field, the
type's version is bumped (``@event("goal.created", version=2)``) and a function from the old JSON object
to the next version's object is registered here. Reading applies the chain ``v -> v+1 -> ... -> current``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from ..clock import iso_held, utc_text
from ..errors import InvalidEventError

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]

_UPCASTERS: Final[dict[tuple[str, int], Upcaster]] = {}


def register_upcaster(type_: str, from_version: int, fn: Upcaster) -> Upcaster:
    """Register ``fn`` to turn a ``type_`` payload of ``from_version`` into ``from_version + 1``."""
    key = (type_, from_version)
    if key in _UPCASTERS and _UPCASTERS[key] is not fn:
        raise ValueError(f"an upcaster for {type_} v{from_version} is already registered")
    _UPCASTERS[key] = fn
    return fn


def times_to_utc(*fields: str) -> Upcaster:
    """The step to the version where ``fields`` became :data:`~loopd_es.events.times.UtcTime` (#25 item 2).

    Those versions stored the times as text: ``""`` for "not recorded" (now ``null``), and an offset other
    than ``Z`` or none at all (now the same instant written in UTC, so a decoded time is always UTC). Text
    naming no time is kept, for the decoder to refuse.
    """

    def step(data: dict[str, Any]) -> dict[str, Any]:
        for name in fields:
            value = data.get(name)
            if value == "":
                data[name] = None
            elif isinstance(value, str):
                data[name] = utc_text(value)
        return data

    named = ", ".join(f"``{name}``" for name in fields)
    became = "became a UTC time" if len(fields) == 1 else "became UTC times"
    step.__doc__ = f'{named} {became}: ``""`` reads as null, a time with an offset is rewritten in UTC.'
    return step


def renamed(old: str, new: str) -> Upcaster:
    """The step to the version where field ``old`` became ``new`` (same value; absent stays absent)."""

    def step(data: dict[str, Any]) -> dict[str, Any]:
        if old in data:
            data[new] = data.pop(old)
        return data

    step.__doc__ = f"``{old}`` became ``{new}`` (the same value)."
    return step


def upcast(type_: str, from_version: int, to_version: int, data: dict[str, Any]) -> dict[str, Any]:
    """Apply the registered chain from ``from_version`` up to ``to_version``.

    :raises InvalidEventError: when a step of the chain is missing or the stored version is newer than ours.
    """
    if from_version > to_version:
        raise InvalidEventError(
            f"{type_} has schema version {from_version}, newer than this loopd-es knows ({to_version}); "
            "upgrade loopd-es to read this log"
        )
    version = from_version
    while version < to_version:
        step = _UPCASTERS.get((type_, version))
        if step is None:
            raise InvalidEventError(f"no upcaster from {type_} v{version} to v{version + 1}")
        data = step(dict(data))
        version += 1
    return data


def summary(type_: str, from_version: int) -> str:
    """What the upcaster from ``type_`` v``from_version`` does: its docstring's first line (docs list it)."""
    doc = _UPCASTERS[(type_, from_version)].__doc__ or ""
    return doc.strip().partition("\n")[0]


def registered() -> list[tuple[str, int]]:
    """Every ``(type, from_version)`` with an upcaster, sorted; used by docs and tests."""
    return sorted(_UPCASTERS)


def epoch_ms_to_text(*fields: str) -> Upcaster:
    """An upcaster turning each of ``fields`` from epoch milliseconds (an int or a float) into RFC 3339 UTC text.

    The ``/loop`` events kept their times as epoch ms until they became :data:`~loopd_es.events.times.UtcTime`;
    this reads such an old payload as the same instants. A field absent or ``null`` is left as it is, and so is
    one that is already text.
    """

    def step(data: dict[str, Any]) -> dict[str, Any]:
        for name in fields:
            value = data.get(name)
            if isinstance(value, int | float) and not isinstance(value, bool):
                data[name] = iso_held(value)
        return data

    named = ", ".join(f"``{name}``" for name in fields)
    step.__doc__ = f"{named}: epoch milliseconds became RFC 3339 UTC text (the same instants)."
    return step
