"""The base of every event payload and the catalogue that maps type strings to payload Structs.

A payload class is registered with :func:`event`, which fixes its stable type string and its current
schema version::

    @event("goal.created")
    class GoalCreated(Event):
        goal_id: str
        name: str

The type string is the envelope's ``type``; the payload is the envelope's ``data`` (without a tag field).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Final, Literal, TypeVar

import msgspec

from ..errors import InvalidEventError


class Event(msgspec.Struct, frozen=True, kw_only=True):
    """Base of every payload: frozen and keyword-only, so fields can be added (with defaults) safely."""

    event_type: ClassVar[str] = ""
    schema_version: ClassVar[int] = 1


class Caller(msgspec.Struct, frozen=True, kw_only=True):
    """Who asked for an event through an OpenCode tool: the calling session, its message and the tool call.

    Carried as ``called_by`` by the events an owner or a worker causes with a tool, so ``history`` and
    ``explain`` can say "completed by worker session S (call C)" instead of ending at an anonymous request.
    """

    role: Literal["owner", "worker"]
    session_id: str
    tool: str
    message_id: str | None = None
    call_id: str | None = None

    def describe(self, verb: str) -> str:
        """``completed by worker session ses_1 (call call_9) with complete_goal, message msg_3``: every view's words."""
        call = f" (call {self.call_id})" if self.call_id else ""
        message = f", message {self.message_id}" if self.message_id else ""
        return f"{verb} by {self.role} session {self.session_id}{call} with {self.tool}{message}"


E = TypeVar("E", bound=type[Event])

CATALOGUE: Final[dict[str, type[Event]]] = {}
"""Every registered payload class by its type string."""

_DECODERS: Final[dict[str, msgspec.json.Decoder[Any]]] = {}
"""Built on first use: a decoder per registered type at import cost every CLI start-up ~100 ms."""


def event(type_: str, *, version: int = 1) -> Callable[[E], E]:
    """Register a payload class under a stable, dotted type string (never derived from the class name)."""
    if "." not in type_:
        raise ValueError(f"event type {type_!r} must be dotted, e.g. 'goal.created'")

    def register(cls: E) -> E:
        if type_ in CATALOGUE and CATALOGUE[type_] is not cls:
            raise ValueError(f"event type {type_!r} is already registered by {CATALOGUE[type_].__name__}")
        cls.event_type = type_
        cls.schema_version = version
        CATALOGUE[type_] = cls
        _DECODERS.pop(type_, None)
        return cls

    return register


def payload_decoder(type_: str) -> msgspec.json.Decoder[Any]:
    """The typed decoder for one registered type.

    :raises InvalidEventError: when the type is not in the catalogue.
    """
    decoder = _DECODERS.get(type_)
    if decoder is None:
        try:
            cls = CATALOGUE[type_]
        except KeyError:
            raise InvalidEventError(
                f"unknown event type {type_!r}; `loopd-es events` lists the types this version knows"
            ) from None
        decoder = _DECODERS[type_] = msgspec.json.Decoder(cls)
    return decoder
