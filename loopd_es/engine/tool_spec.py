"""One tool as OpenCode shows it to the model: the shape shared by the tool tables and the tool-file writer."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ToolSpec:
    """One tool as OpenCode shows it to the model, and who may call it."""

    name: str
    role: str  # "worker" or "owner"
    description: str
    args: dict[str, tuple[str, bool, str]]  # name -> (zod type, required, description)
    asks: str | None = None
    """An OpenCode permission the tool file asks for before it forwards the call (``bash`` for a command start,
    as the reference does: patterns ``[argv joined]``, always ``[command]``)."""
