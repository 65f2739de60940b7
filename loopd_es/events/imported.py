"""Import events: what ``loopd-es import-loopd`` took from an ``opencode-loopd`` project, on ``import-<id>``.

An import writes ``import.started`` first, then one atomic batch per goal and command stream, then
``import.completed``. Every event of those batches carries the import stream's name as its
``correlation_id`` and the previous event of its stream (the first: ``import.started``) as its
``causation_id``; ``import.completed`` says, for each event id, whether it was copied from a ledger line
(``ledger:<line>``) or synthesised from the state snapshot (``state:<what>``). A stream with
``import.started`` but no ``import.completed`` is an interrupted import: running it again completes it.

Payloads hold no import time (the envelope has one), so a retried import is byte-identical and the log
returns the originals instead of writing twice.
"""

from __future__ import annotations

from typing import Final

import msgspec

from .base import Event, event

STREAM_PREFIX: Final = "import-"


class ImportedEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One event an import wrote: its id, type and source (``ledger:<line>`` or ``state:<what>``)."""

    event_id: str
    type: str
    source: str


class ImportedStream(msgspec.Struct, frozen=True, kw_only=True):
    """The events an import wrote to one stream, in stream order."""

    stream: str
    events: tuple[ImportedEvent, ...] = ()


@event("import.started")
class ImportStarted(Event, frozen=True):
    """An import of a loopd project began: which files, which revision, and which streams it will write."""

    import_id: str
    directory: str
    state_version: int
    state_revision: int
    state_sha256: str
    ledger_lines: int = 0
    ledger_sha256: str = ""
    streams: tuple[str, ...] = ()


@event("import.completed")
class ImportCompleted(Event, frozen=True):
    """Every stream of the import was written; ``warnings`` lists what could not be carried over."""

    import_id: str
    streams: tuple[ImportedStream, ...] = ()
    skipped_ledger_lines: tuple[int, ...] = ()
    warnings: tuple[str, ...] = ()
