"""One tool as OpenCode shows it to the model: its arguments are one msgspec Struct, decoded strictly.

The Struct is the single source: the tool file's zod schema (:mod:`.opencode_tools`), the required-argument
check and the decoding of every call come from it, so what OpenCode offers and what the engine accepts cannot
drift. A wrong type, an unknown field or a value out of range is refused with one line naming the field.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from ..errors import UsageError


class ToolArgs(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every tool's arguments: unknown fields are refused, absent optional ones are ``UNSET``."""


class NoArgs(ToolArgs, frozen=True, kw_only=True):
    """A tool that takes no arguments."""


class ToolArgsError(UsageError):
    """Raised when a tool call's arguments do not decode: the message names the tool and the field."""

    def __init__(self, tool: str, detail: str) -> None:
        super().__init__(f"Invalid arguments for {tool}: {detail}.")
        self.tool = tool


NUL: Final = "\x00"


@dataclass(frozen=True)
class ToolSpec:
    """One tool as OpenCode shows it to the model, and who may call it."""

    name: str
    role: str  # "worker" or "owner"
    description: str
    args: type[ToolArgs] = NoArgs
    asks: str | None = None
    """An OpenCode permission the tool file asks for before it forwards the call (``bash`` for a command start,
    as the reference does: patterns ``[argv joined]``, always ``[command]``)."""
    nul_allowed: tuple[str, ...] = ()
    """Text arguments that may hold a NUL (``input``: bytes typed into a terminal, never recorded)."""
    blank_reaches: bool = False
    """A required argument given as ``""`` reaches the tool, which answers it in the reference's own words
    (``Nothing to send.``, ``Switch denied``), rather than being refused as missing."""

    def schema(self) -> dict[str, Any]:
        """The JSON schema of the arguments object (msgspec's, with the Struct's own title and doc left out)."""
        return _schema_of(self.args)

    def properties(self) -> dict[str, dict[str, Any]]:
        """Each argument's JSON schema, in declaration order."""
        props: dict[str, dict[str, Any]] = self.schema()["properties"]
        return props

    def required(self) -> tuple[str, ...]:
        """The arguments a call must carry."""
        return tuple(self.schema()["required"])

    def decode(self, args: dict[str, Any]) -> ToolArgs:
        """``args`` as this tool's Struct: no coercion, no unknown field, no value out of range, no NUL in text.

        :raises ToolArgsError: naming the field at fault.
        """
        try:
            decoded = msgspec.convert(args, type=self.args, strict=True)
        except msgspec.ValidationError as e:
            raise ToolArgsError(self.name, str(e)) from None
        for name in decoded.__struct_fields__:
            if name not in self.nul_allowed and _has_nul(getattr(decoded, name)):
                raise ToolArgsError(self.name, f"a NUL character is not allowed - at `$.{name}`")
        return decoded


@functools.cache
def _schema_of(args: type[ToolArgs]) -> dict[str, Any]:
    whole = msgspec.json.schema(args)
    body = dict(whole["$defs"][whole["$ref"].rsplit("/", 1)[-1]])
    body.pop("title", None)
    body.pop("description", None)
    body.setdefault("required", [])
    return body


def _has_nul(value: object) -> bool:
    if isinstance(value, str):
        return NUL in value
    if isinstance(value, tuple | list):
        return any(_has_nul(v) for v in value)
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    return False
