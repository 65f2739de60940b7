"""Import events: what ``loopd-es import-loopd`` took from an ``opencode-loopd`` project, on ``import-<id>``.

An import writes ``import.started`` first, then one atomic batch per goal and command stream, then
``import.completed``. Every event of those batches carries the import stream's name as its
``correlation_id`` and the previous event of its stream (the first: ``import.started``) as its
``causation_id``; ``import.completed`` says, for each event id, whether it was copied from a ledger line
(``ledger:<line>``) or synthesised from the state snapshot (``state:<what>``). A stream with
``import.started`` but no ``import.completed`` is an interrupted import: running it again completes it.

Payloads hold no import time (the envelope has one), so a retried import is byte-identical and the log
returns the originals instead of writing twice.

**Source time and provenance.** The envelope's ``recorded_at`` is the import instant (true: that is when the
log got the event). When the event happened is a fact of the source, so every imported payload carries two
more keys, beside its catalogued fields (typed readers ignore them; they survive ``export``/``import``):

* ``occurred_at`` (:data:`OCCURRED_AT`): the time the source gives, RFC 3339 - the ledger line's
  ``timestamp``, or the state field's own time (``blocker.at``, ``createdAt``, ``endedAt`` ...);
* ``imported`` (:data:`IMPORTED`): ``{"source": "ledger:<line>" | "state:<what>", "time_from": ...}``, where
  ``time_from`` names the line or field the time was read from (``previous`` when the field has none and
  the event is placed at the time of the one before it).

``history``, ``explain``, the HTML timeline and the read models read time as :func:`happened_at`:
``occurred_at`` when present, else ``recorded_at``; an event whose source is ``state:`` is shown as
synthesised from state.json.

**Times stay the reference's text here.** The catalogued events an import writes (``goal.*``, ``run.*``,
``command.*`` ...) carry aware UTC datetimes like any other (:data:`~loopd_es.events.times.UtcTime`), but
this module's ``goal.runtime_imported`` snapshot (its runtime times and verification attempts), the control
requests and ``occurred_at`` keep the reference's own time text verbatim: ``import-loopd`` and ``export`` must round-trip
a project's state to the character, and the reference writes its own forms (milliseconds, ``Z``).

**Causes.** An imported event's ``causation_id`` is the event the source shows caused it (a run's end ->
its ``run.started``, a pause -> the owner's control request, a command's exit -> its start), else
``import.started``: a stream's previous event is not its cause.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, Literal

import msgspec

from .base import Event, event

if TYPE_CHECKING:
    from .envelope import Envelope

STREAM_PREFIX: Final = "import-"
CONTROL_PREFIX: Final = "control-"
"""Stream of one owner control request (``control-<requestID>``), as loopd's ``state.commandLedger`` kept it."""
OCCURRED_AT: Final = "occurred_at"
IMPORTED: Final = "imported"
_MARK: Final = b'"occurred_at"'


class Provenance(msgspec.Struct, frozen=True, kw_only=True):
    """Where an imported event came from and where its time was read."""

    source: str
    time_from: str = ""

    @property
    def synthesised(self) -> bool:
        """True for an event built from the state snapshot (no ledger line says it happened)."""
        return self.source.startswith("state:")


class _Stamped(msgspec.Struct, frozen=True):
    occurred_at: str | None = None
    imported: Provenance | None = None


_STAMP_DECODER: Final = msgspec.json.Decoder(_Stamped)
_ENCODER: Final = msgspec.json.Encoder()


def stamp(data: bytes, occurred_at: str, provenance: Provenance) -> bytes:
    """The payload JSON object ``data`` with ``occurred_at`` and ``imported`` added (an empty time is left out)."""
    extra: dict[str, Any] = {IMPORTED: provenance}
    if occurred_at:
        extra = {OCCURRED_AT: occurred_at, **extra}
    tail = _ENCODER.encode(extra)
    body = data.rstrip()
    if body == b"{}":
        return tail
    return body[:-1] + b"," + tail[1:]


def stamped(data: bytes | msgspec.Raw) -> tuple[str | None, Provenance | None]:
    """``(occurred_at, provenance)`` of a stored payload; ``(None, None)`` for events nothing stamped.

    Costs one substring search for an unstamped payload (the usual case outside imports).
    """
    raw = bytes(data)
    if _MARK not in raw and b'"imported"' not in raw:
        return None, None
    try:
        got = _STAMP_DECODER.decode(raw)
    except msgspec.DecodeError:
        return None, None
    return got.occurred_at, got.imported


def happened_at(env: Envelope) -> str:
    """When the event happened: its source's ``occurred_at`` when an import wrote it, else when it was recorded.

    Imported events carry their import's stream as correlation id, so other events cost one prefix test.
    """
    flow = env.correlation_id
    if flow is None or not flow.startswith(STREAM_PREFIX):
        return env.recorded_at
    return stamped(env.data)[0] or env.recorded_at


class SkippedLine(msgspec.Struct, frozen=True, kw_only=True):
    """A ledger line the import read but did not turn into an event, and why."""

    line: int
    type: str
    reason: str
    offset: int | None = None
    """The line's byte offset in the ledger (set for a torn tail: where a repair would cut the file)."""


class DroppedField(msgspec.Struct, frozen=True, kw_only=True):
    """A ``state.json`` field the import did not keep (``runtimes[].idleCandidateAt``), how often, and why."""

    path: str
    reason: str
    count: int = 1


class CheckResult(msgspec.Struct, frozen=True, kw_only=True):
    """One check of a verification attempt: the command and its exit code, with its output as loopd kept it."""

    command: str
    exit_code: int | None = None
    stderr: str | None = None
    stdout: str | None = None


class VerificationAttempt(msgspec.Struct, frozen=True, kw_only=True):
    """One ``complete_goal`` check run as loopd kept it (docs/reference/loopd.md#s1-4), without check
    output."""

    attempt_id: str
    sequence: int = 0
    run_generation: int = 0
    status: Literal["running", "passed", "failed"]
    started_at: str = ""
    completed_at: str | None = None
    failed_checks: tuple[str, ...] = ()
    claimed_summary: str = ""
    claimed_evidence: str = ""
    cwd: str | None = None
    checks: tuple[CheckResult, ...] = ()
    """Every check loopd recorded (a failed attempt keeps only its failures, a passed one all).

    What loopd keeps of a verification attempt: docs/reference/loopd.md#s1-4.
    """


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
    migrated_version: int | None = None
    """The state version the import read ``state_version`` as (loopd's own migrations, in memory); None
    in imports written before it was recorded."""


@event("import.completed")
class ImportCompleted(Event, frozen=True):
    """Every stream of the import was written; ``warnings`` lists what could not be carried over."""

    import_id: str
    streams: tuple[ImportedStream, ...] = ()
    skipped_ledger_lines: tuple[int, ...] = ()
    warnings: tuple[str, ...] = ()
    skipped: tuple[SkippedLine, ...] = ()
    """Every parseable (and torn) ledger line that did not become an event, with its reason."""
    needs_reconcile: tuple[str, ...] = ()
    """Commands state.json shows running: their process is not ours; ``--reconcile`` settles them."""
    dropped_fields: tuple[DroppedField, ...] = ()
    """Every ``state.json`` field present in the source that no imported event keeps, with the reason."""


@event("goal.runtime_imported")
class GoalRuntimeImported(Event, frozen=True):
    """What loopd's runtime record (``state.runtimes[]``) said when it was imported, field for field.

    The ledger is lossy (runs, usage and schedule bookkeeping leave no line), so the counters are set from
    the snapshot instead of being made up as events that never happened: ``run_count`` (turns acquired) and
    ``budget_turn_count`` (turns charged) stay distinct. The other fields are kept for the post-mortem.
    """

    goal_id: str
    run_count: int
    budget_turn_count: int
    run_generation: int
    no_progress_count: int = 0
    consecutive_failures: int = 0
    schedule_run_count: int | None = None
    next_run_at: str | None = None
    last_schedule_at: str | None = None
    last_run_at: str | None = None
    last_compact_at: str | None = None
    active_tool_call_ids: tuple[str, ...] = ()
    last_parent_notified_at: str | None = None
    last_parent_notified_for: str | None = None
    last_worker_status: str | None = None
    free_retry_pending: bool = False
    verification_attempts: tuple[VerificationAttempt, ...] = ()
    ledger_runs: int = 0
    """How many of ``run_count`` turns the ledger has a ``run.started`` line for."""
    turn_started_at: str | None = None
    last_error: str | None = None
    progress_during_turn: bool | None = None
    turn_tokens_used: int | None = None
    force_finish_requested: bool | None = None
    stuck_notified_run_id: str | None = None
    worker_aborted_at: str | None = None


@event("control.requested")
class ControlRequested(Event, frozen=True):
    """An owner control request (TUI / control bus) was accepted: ``pause``, ``resume``, ``cmd_start`` ..."""

    request_id: str
    command: str
    goal_id: str | None = None
    at: str = ""


@event("control.completed")
class ControlCompleted(Event, frozen=True):
    """The control request was handled (loopd's ledger keeps only handled ones) or rejected, with its reason."""

    request_id: str
    command: str
    goal_id: str | None = None
    outcome: Literal["handled", "rejected"] = "handled"
    reason: str | None = None
    at: str = ""
