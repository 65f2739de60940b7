"""The catalogue: every event type this version knows, how to validate it and how to read it back.

Importing this module imports every payload module (goal, run, identity, command, saga, imported, loop), so
:data:`~loopd_es.events.base.CATALOGUE` is complete afterwards. ``loopd-es append`` calls :func:`validate`
before anything is written; readers call :func:`decode_payload`, which upcasts old schema versions.
"""

from __future__ import annotations

import types
import typing
from typing import TYPE_CHECKING, Any, Final

import msgspec

from ..errors import InvalidEventError
from . import command, engine, goal, identity, imported, loop, notification, run, saga
from .base import CATALOGUE, Event, payload_decoder
from .envelope import NewEvent
from .upcasting import upcast

if TYPE_CHECKING:
    from .envelope import Foldable

PAYLOAD_MODULES: Final = (
    goal,
    run,
    identity,
    saga,
    command,
    imported,
    engine,
    notification,
    loop,
)
"""Every payload module; importing this module registers all their event types."""

_DICT: Final = msgspec.json.Decoder(dict[str, Any])


def event_class(type_: str) -> type[Event]:
    """The payload class of ``type_``.

    :raises InvalidEventError: for a type not in the catalogue.
    """
    try:
        return CATALOGUE[type_]
    except KeyError:
        raise InvalidEventError(
            f"unknown event type {type_!r}; `loopd-es events` lists the types this version knows"
        ) from None


def validate(type_: str, data: bytes, schema_version: int | None = None) -> None:
    """Check that ``data`` (JSON bytes) is a valid ``type_`` payload of ``schema_version`` (default: current).

    :raises InvalidEventError: for an unknown type, an unknown version, or a payload that does not decode;
        the message carries msgspec's path, e.g. ``Expected `str`, got `int` - at `$.name```.
    """
    decode_data(type_, data, schema_version)


def decode_data(type_: str, data: bytes, schema_version: int | None = None) -> Event:
    """Decode one payload to its current class, upcasting an older ``schema_version``.

    :raises InvalidEventError: as :func:`validate`.
    """
    cls = event_class(type_)
    try:
        if schema_version is None or schema_version == cls.schema_version:
            result: Event = payload_decoder(type_).decode(data)
            return result
        raw = _DICT.decode(data)
        current = upcast(type_, schema_version, cls.schema_version, raw)
        return msgspec.convert(current, cls)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        shown = f" v{schema_version}" if schema_version not in (None, cls.schema_version) else ""
        raise InvalidEventError(f"invalid payload for {type_}{shown}: {e}") from None


def decode_payload(envelope: Foldable) -> Event:
    """The envelope's payload as its typed, current-version event.

    :raises InvalidEventError: when the stored payload does not match the catalogue.
    """
    return decode_data(envelope.type, bytes(envelope.data), envelope.schema_version)


def json_schema() -> dict[str, Any]:
    """JSON Schema of every payload: ``{"events": {type: {"version", "schema"}}, "$defs": {...}}``."""
    types_ = sorted(CATALOGUE)
    classes = [CATALOGUE[t] for t in types_]
    schemas, components = msgspec.json.schema_components(classes, ref_template="#/$defs/{name}")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "loopd-es event payloads",
        "events": {
            t: {"schema_version": CATALOGUE[t].schema_version, "schema": s}
            for t, s in zip(types_, schemas, strict=True)
        },
        "$defs": components,
    }


class FieldInfo(msgspec.Struct, frozen=True):
    """One payload field as the catalogue listing shows it."""

    name: str
    type: str
    required: bool
    default: str | None


def describe() -> list[tuple[str, int, str, list[FieldInfo]]]:
    """``(type, schema_version, summary, fields)`` for every event, sorted by type."""
    result = []
    for type_ in sorted(CATALOGUE):
        cls = CATALOGUE[type_]
        hints = typing.get_type_hints(cls)
        fields = []
        for f in msgspec.structs.fields(cls):
            required = f.required
            default = None if required else _show_default(f)
            fields.append(FieldInfo(f.encode_name, _show_type(hints[f.name]), required, default))
        summary = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
        result.append((type_, cls.schema_version, summary, fields))
    return result


def _show_default(f: msgspec.structs.FieldInfo) -> str:
    if f.default is not msgspec.NODEFAULT:
        value = f.default
        if isinstance(value, msgspec.Struct):
            return f"{type(value).__name__}()"
        return repr(value)
    if f.default_factory is not msgspec.NODEFAULT:
        return f"{getattr(f.default_factory, '__name__', 'factory')}()"
    return ""


def _show_type(tp: Any) -> str:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_show_type(a) for a in args)
    if origin is tuple:
        return f"list[{_show_type(args[0])}]" if args else "list"
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(_show_type(a) for a in args)}]"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def new_event(
    payload: Event,
    *,
    event_id: str | None = None,
    causation_id: str | None = None,
    correlation_id: str | None = None,
) -> NewEvent:
    """A :class:`NewEvent` for a typed payload, with its registered type string and schema version."""
    extra = {"event_id": event_id} if event_id else {}
    return NewEvent(
        type=payload.event_type,
        data=payload,
        schema_version=payload.schema_version,
        causation_id=causation_id,
        correlation_id=correlation_id,
        **extra,
    )
