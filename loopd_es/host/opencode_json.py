"""OpenCode's JSON as Structs: the replies of its HTTP API and the payloads of its ``/event`` stream.

Only the fields this engine reads are declared, and they are decoded strictly: a field of the wrong type is
one error naming it (``Expected `str`, got `int` - at `$.info.id```), never a ``str()`` or ``int()`` guess.
Fields OpenCode adds are ignored (it adds them between releases); absent optional ones take the default.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

T = TypeVar("T")
Number = int | float
"""OpenCode's numbers are JavaScript numbers: a count may arrive as ``5`` or ``5.0``."""


class _J(msgspec.Struct, frozen=True, kw_only=True):
    """Base: unknown fields ignored, declared ones typed."""


class ModelRef(_J, frozen=True):
    providerID: str | None = None
    id: str | None = None
    modelID: str | None = None

    def ref(self) -> str | None:
        """``providerID/modelID``, or ``None`` when either part is missing."""
        model_id = self.id or self.modelID
        return f"{self.providerID}/{model_id}" if self.providerID and model_id else None


class OpenApiDoc(_J, frozen=True):
    """``GET /doc``: only which routes the server offers (path -> method -> operation)."""

    paths: dict[str, dict[str, Any]] = {}


class SessionInfo(_J, frozen=True):
    """``GET /session/{id}``, ``POST /session``."""

    id: str
    agent: str | None = None
    model: ModelRef | None = None


class StatusInfo(_J, frozen=True):
    """One entry of ``GET /session/status``, or a ``session.status`` event's ``status``."""

    type: str = "idle"
    message: str | None = None
    attempt: Number | None = None
    next: Number | None = None


class Limit(_J, frozen=True):
    context: int | None = None
    output: int | None = None


class ModelEntry(_J, frozen=True):
    name: str | None = None
    limit: Limit = Limit()


class ProviderEntry(_J, frozen=True):
    id: str
    name: str | None = None
    models: dict[str, ModelEntry] = {}


class Providers(_J, frozen=True):
    """``GET /provider``."""

    all: list[ProviderEntry] = []
    connected: list[str] = []


class AgentEntry(_J, frozen=True):
    """One agent of ``GET /agent``."""

    name: str
    mode: str | None = None
    description: str | None = None
    hidden: bool = False


class Times(_J, frozen=True):
    created: Number | None = None
    completed: Number | None = None


class Cache(_J, frozen=True):
    read: Number = 0
    write: Number = 0


class Tokens(_J, frozen=True):
    input: Number = 0
    output: Number = 0
    reasoning: Number = 0
    cache: Cache = Cache()


class MessageInfo(_J, frozen=True):
    id: str = ""
    role: str = ""
    parentID: str | None = None
    time: Times = Times()
    tokens: Tokens = Tokens()
    cost: Number = 0.0
    finish: str | None = None
    """Why the assistant message stopped (``stop``, ``tool-calls``, ...): the turn-end proof reads it."""
    error: dict[str, Any] | None = None


class PartState(_J, frozen=True):
    status: str | None = None


class Part(_J, frozen=True):
    type: str = ""
    id: str | None = None
    messageID: str | None = None
    callID: str | None = None
    text: str | None = None
    state: PartState = PartState()


class MessageRow(_J, frozen=True):
    """One entry of ``GET /session/{id}/message``."""

    info: MessageInfo = MessageInfo()
    parts: list[Part] = []


class BusEvent(_J, frozen=True):
    """One ``/event`` payload: its ``type`` and, still undecoded, its ``properties``."""

    type: str = ""
    properties: msgspec.Raw = msgspec.Raw(b"{}")


class SessionProps(_J, frozen=True):
    sessionID: str = ""


class StatusProps(SessionProps, frozen=True):
    status: StatusInfo = StatusInfo()


class ErrorProps(SessionProps, frozen=True):
    error: dict[str, Any] = {}
    """Providers' errors differ in shape: :func:`~.opencode_events.normalise_error` reads them."""


class MessageProps(SessionProps, frozen=True):
    info: MessageInfo = MessageInfo()


class PartProps(SessionProps, frozen=True):
    part: Part = Part()


class PermissionProps(SessionProps, frozen=True):
    id: str | None = None
    permission: str | None = None


PROPS: dict[str, type[SessionProps]] = {
    "session.status": StatusProps,
    "session.error": ErrorProps,
    "message.updated": MessageProps,
    "message.part.updated": PartProps,
    "permission.asked": PermissionProps,
    "permission.updated": PermissionProps,
}
"""The properties of each event this engine reads beyond ``sessionID`` (every other type: :class:`SessionProps`)."""


def convert(value: object, into: type[T]) -> T:
    """``value`` (JSON already parsed) as ``into``, strictly.

    :raises msgspec.ValidationError: naming the field at fault.
    """
    return msgspec.convert(value, type=into, strict=True)
