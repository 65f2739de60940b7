"""Build every event of an import in memory, then append them: the import stream, one batch per stream, done.

Nothing is written until the whole project has been read, validated and mapped, so a corrupt state file
or ledger changes nothing. Event ids are UUIDv5 over the import id (a hash of the project directory), the
stream, the event's place in it and its source, so a second import of an unchanged project builds the
identical batches and the log returns the originals instead of appending; an import of a project that
changed since is refused before anything is written, because its streams would fork.
"""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Final

import msgspec

from ..clock import parse_rfc3339
from ..errors import ConflictError, LoopdError, StorageError
from ..events.catalogue import new_event
from ..events.envelope import NO_STREAM
from ..events.imported import (
    CONTROL_PREFIX,
    STREAM_PREFIX,
    DroppedField,
    ImportCompleted,
    ImportedEvent,
    ImportedStream,
    ImportStarted,
    Provenance,
    SkippedLine,
    stamp,
)
from ..ids import InvalidIdError, is_valid_id
from .builder import Emitted, Report
from .check import differences
from .commands import build_commands, needs_reconcile
from .controls import build_controls, command_starters
from .fields import dropped_fields
from .goals import Control, GoalInput, build_goal
from .ledger import LedgerLine, load_ledger
from .source import LOOPD_DIR, ImportSourceError, load_state

if TYPE_CHECKING:
    from ..events.envelope import NewEvent
    from ..log.base import LogStore
    from .ledger import LoadedLedger
    from .source import LoadedState

NAMESPACE: Final = uuid.UUID("5b0f3c52-8a51-4d3e-9a40-6c1f2f0e1a77")
"""The UUIDv5 namespace of imported event ids (fixed forever: changing it would re-import everything)."""


class ImportConflictError(ConflictError):
    """Raised when the log already holds a different import of the directory, or streams it would write."""


class ImportIncompleteError(StorageError):
    """Raised when an append failed part-way; the message lists what was written and how to finish."""


class StreamBatch(msgspec.Struct, frozen=True, kw_only=True):
    """One stream's events as they will be appended, with each event's source."""

    stream: str
    events: tuple[NewEvent, ...]
    sources: tuple[str, ...]
    from_ledger: int


class ImportPlan(msgspec.Struct, frozen=True, kw_only=True):
    """Everything an import will write, built before anything is written."""

    directory: Path
    import_id: str
    stream: str
    started: NewEvent
    batches: tuple[StreamBatch, ...]
    completed: NewEvent
    goals: int
    commands: int
    warnings: tuple[str, ...]
    torn_line: int | None
    skipped: tuple[SkippedLine, ...] = ()
    needs_reconcile: tuple[str, ...] = ()
    source_version: int = 0
    migrated_version: int = 0
    dropped_fields: tuple[DroppedField, ...] = ()
    ledger_count: int = 0
    state_sha256: str = ""
    """Lines in the ledger (with its rotated segments), a torn last one included."""
    goal_inputs: tuple[GoalInput, ...] = ()
    """What each goal's stream was built from (a mirror continues a held stream from it)."""

    @property
    def event_count(self) -> int:
        return sum(len(b.events) for b in self.batches) + 2


class ImportResult(msgspec.Struct, frozen=True, kw_only=True):
    """What an import appended: streams written now, and streams that an earlier run had already written."""

    written: tuple[str, ...]
    already: tuple[str, ...]
    appended_events: int


def import_id_for(directory: Path) -> str:
    """The import id of a project: the first 16 hex digits of sha256 over its resolved path."""
    return hashlib.sha256(str(directory.resolve()).encode()).hexdigest()[:16]


def build_plan(directory: Path, *, map_goals: bool = True) -> ImportPlan:
    """Read, validate and map a loopd project; no I/O besides reading its two files.

    ``map_goals=False`` leaves the goal streams out of the batches (a mirror continuing them maps only
    their new lines, from :attr:`ImportPlan.goal_inputs`).

    :raises ImportSourceError: for a missing directory or a corrupt ``state.json`` / ``events.ndjson``.
    """
    if not directory.is_dir():
        raise ImportSourceError(directory, "no such directory")
    base = directory / LOOPD_DIR
    loaded = load_state(base / "state.json")
    ledger = load_ledger(base / "events.ndjson")
    _check_ids(loaded, ledger)
    state = loaded.state
    report = Report()
    import_id = import_id_for(directory)
    goal_lines: dict[str, list[LedgerLine]] = {}
    command_lines: list[LedgerLine] = []
    control_lines: list[LedgerLine] = []
    for line in ledger.lines:
        if line.type in ("command.accepted", "command.rejected"):
            control_lines.append(line)
        elif line.type.startswith("command."):
            command_lines.append(line)
        elif line.goal_id:
            goal_lines.setdefault(line.goal_id, []).append(line)
        else:
            report.skip("ledger", line, "names no goal (no goalID) and is not a command event")
    controls = build_controls(state.command_ledger, control_lines, ledger.path, report)
    control_ids = {
        rid: imported_event_id(import_id, f"{CONTROL_PREFIX}{rid}", 0, items[0].source)
        for rid, items in controls.items()
    }
    by_goal: dict[str, list[Control]] = {}
    for entry in state.command_ledger:
        if entry.goal_id:
            by_goal.setdefault(entry.goal_id, []).append(
                Control(entry.command, entry.accepted_at, entry.completed_at, control_ids[entry.request_id])
            )
    runtimes = {rt.goal_id: rt for rt in state.runtimes}
    snaps = {goal.id: goal for goal in state.goals}
    mapped: list[tuple[str, list[Emitted]]] = []
    inputs: list[GoalInput] = []
    for goal_id in [*snaps, *(k for k in goal_lines if k not in snaps)]:
        data = GoalInput(
            goal_id=goal_id,
            goal=snaps.get(goal_id),
            runtime=runtimes.get(goal_id),
            lines=tuple(goal_lines.get(goal_id, ())),
            ledger_path=ledger.path,
            controls=tuple(by_goal.get(goal_id, ())),
        )
        inputs.append(data)
        if not map_goals:
            continue
        items = build_goal(data, report)
        snap = snaps.get(goal_id)
        if snap is not None:
            report.warnings.extend(
                f"goal {goal_id}: {d}" for d in differences(snap, runtimes.get(goal_id), items)
            )
        if items:
            mapped.append((f"goal-{goal_id}", items))
    starters = command_starters(state.command_ledger, command_lines, control_ids)
    commands = build_commands(
        state.commands,
        state.command_awaits,
        command_lines,
        ledger.path,
        report,
        starters,
        as_of=_written(loaded, ledger),
    )
    mapped.extend((f"command-{cid}", items) for cid, items in commands.items() if items)
    mapped.extend((f"{CONTROL_PREFIX}{rid}", items) for rid, items in controls.items())
    reconcile = needs_reconcile(state.commands, commands)
    skipped = list(report.skipped)
    if ledger.torn_line is not None:
        torn = (
            f"an incomplete write at byte {ledger.torn_offset} (no newline, not JSON); the ledger's "
            f"complete part is its first {ledger.torn_offset} bytes"
        )
        report.warnings.insert(0, f"{ledger.path} line {ledger.torn_line} is {torn}; skipped")
        skipped.append(SkippedLine(line=ledger.torn_line, type="", reason=torn, offset=ledger.torn_offset))
    skipped.sort(key=lambda k: k.line)
    warnings = report.warnings
    ended = {cmd.id for cmd in state.commands if cmd.status == "running"} - set(reconcile)
    dropped = dropped_fields(loaded.document, frozenset(ended))

    stream = f"{STREAM_PREFIX}{import_id}"
    started_payload = ImportStarted(
        import_id=import_id,
        directory=str(directory.resolve()),
        state_version=loaded.source_version,
        migrated_version=state.version,
        state_revision=state.revision,
        state_sha256=loaded.sha256,
        ledger_lines=ledger.count,
        ledger_sha256=ledger.sha256,
        streams=tuple(name for name, _ in mapped),
    )
    started = new_event(
        started_payload, event_id=imported_event_id(import_id, stream, 0, "started"), correlation_id=stream
    )
    batches = tuple(stream_batch(import_id, stream, started.event_id, name, items) for name, items in mapped)
    completed_payload = ImportCompleted(
        import_id=import_id,
        streams=tuple(
            ImportedStream(
                stream=b.stream,
                events=tuple(
                    ImportedEvent(event_id=e.event_id, type=e.type, source=src)
                    for e, src in zip(b.events, b.sources, strict=True)
                ),
            )
            for b in batches
        ),
        skipped_ledger_lines=tuple(k.line for k in skipped),
        warnings=tuple(warnings),
        skipped=tuple(skipped),
        needs_reconcile=reconcile,
        dropped_fields=dropped,
    )
    completed = new_event(
        completed_payload,
        event_id=imported_event_id(import_id, stream, 1, "completed"),
        causation_id=started.event_id,
        correlation_id=stream,
    )
    return ImportPlan(
        directory=directory,
        import_id=import_id,
        stream=stream,
        started=started,
        batches=batches,
        completed=completed,
        goals=sum(1 for name, _ in mapped if name.startswith("goal-")),
        commands=len(commands),
        warnings=tuple(warnings),
        torn_line=ledger.torn_line,
        skipped=tuple(skipped),
        needs_reconcile=reconcile,
        source_version=loaded.source_version,
        migrated_version=state.version,
        dropped_fields=dropped,
        ledger_count=ledger.count,
        state_sha256=loaded.sha256,
        goal_inputs=tuple(inputs),
    )


def _written(loaded: LoadedState, ledger: LoadedLedger) -> str:
    """The source's last write: its latest record ``updatedAt`` or ledger timestamp (``""`` if none).

    Compared as instants, so mixed offsets and precisions order correctly.
    """
    st = loaded.state
    times = [
        *(g.updated_at for g in st.goals),
        *(r.updated_at for r in st.runtimes),
        *(c.updated_at for c in st.commands),
        *(ln.timestamp for ln in ledger.lines),
    ]
    best, best_at = "", None
    for t in times:
        try:
            at = parse_rfc3339(t)
        except ValueError:
            continue
        if best_at is None or at > best_at:
            best, best_at = t, at
    return best


def _check_ids(loaded: LoadedState, ledger: LoadedLedger) -> None:
    """Refuse the whole import when any goal, command or request id could not safely be a stream or file name.

    :raises ImportSourceError: naming the file, the record and the id.
    """
    st, sp, lp = loaded.state, loaded.path, ledger.path
    checks = [
        *((sp, "goal", g.id, f"goals[{i}].id") for i, g in enumerate(st.goals)),
        *((sp, "goal", r.goal_id, f"runtimes[{i}].goalID") for i, r in enumerate(st.runtimes)),
        *((sp, "command", c.id, f"commands[{i}].id") for i, c in enumerate(st.commands)),
        *((sp, "goal", c.goal_id, f"commands[{i}].goalID") for i, c in enumerate(st.commands) if c.goal_id),
        *((sp, "goal", a.goal_id, f"commandAwaits[{i}].goalID") for i, a in enumerate(st.command_awaits)),
        *(
            (sp, "command", a.command_id, f"commandAwaits[{i}].commandID")
            for i, a in enumerate(st.command_awaits)
        ),
        *((lp, "goal", ln.goal_id, f"line {ln.line} goalID") for ln in ledger.lines if ln.goal_id),
        *(
            (lp, "command", ln.command_id, f"line {ln.line} commandID")
            for ln in ledger.lines
            if ln.command_id
        ),
        # control requests become control-<requestID> streams
        *(
            (sp, "control request", e.request_id, f"commandLedger[{i}].requestID")
            for i, e in enumerate(st.command_ledger)
        ),
        *(
            (lp, "control request", ln.fields.get("requestID"), f"line {ln.line} requestID")
            for ln in ledger.lines
            if ln.type in ("command.accepted", "command.rejected")
        ),
    ]
    for path, kind, value, where in checks:
        if not is_valid_id(value):
            raise ImportSourceError(path, str(InvalidIdError(kind, value, where)))


def imported_event_id(import_id: str, stream: str, index: int, source: str) -> str:
    """The id of the event at ``index`` of ``stream`` with ``source``: the same every time it is built."""
    return str(uuid.uuid5(NAMESPACE, f"{import_id}/{stream}/{index}/{source}"))


def stream_batch(
    import_id: str,
    import_stream: str,
    started: str,
    stream: str,
    items: list[Emitted],
    held: tuple[str, ...] = (),
) -> StreamBatch:
    """Stamp each event with its source time and provenance, and link it to its cause.

    The cause is the event the source shows caused it (:attr:`Emitted.cause`), else ``import.started``;
    an event without a time of its own is placed at the time of the one before it (``time_from: previous``).
    With ``held`` (the ids of the stream's first events, already in the log: a mirror continuing it), only
    ``items`` after those become events, and a cause among them is its held id.
    """
    events: list[NewEvent] = []
    ids = list(held)
    previous = items[len(held) - 1].at if held else ""
    for index, item in enumerate(items):
        if index < len(held):
            continue
        at, at_from = item.at, item.at_from
        if not at:
            at, at_from = previous, "previous" if previous else ""
        previous = at
        cause = item.cause
        causation = ids[cause] if isinstance(cause, int) and cause < index else cause
        event = new_event(
            item.payload,
            event_id=imported_event_id(import_id, stream, index, item.source),
            causation_id=causation if isinstance(causation, str) else started,
            correlation_id=import_stream,
        )
        data = stamp(event.data_bytes(), at, Provenance(source=item.source, time_from=at_from))
        event = msgspec.structs.replace(event, data=msgspec.Raw(data))
        events.append(event)
        ids.append(event.event_id)
    sources = tuple(item.source for item in items[len(held) :])
    return StreamBatch(
        stream=stream,
        events=tuple(events),
        sources=sources,
        from_ledger=sum(1 for s in sources if s.startswith("ledger:")),
    )


async def apply_plan(store: LogStore, plan: ImportPlan) -> ImportResult:
    """Append what the log does not hold yet: ``import.started``, each stream, ``import.completed``.

    Every stream is checked first; a stream that holds anything but exactly this import's events stops
    the import before it writes.

    :raises ImportConflictError: when the log holds a different import of this directory, or a stream of
        the same name with other events.
    :raises ImportIncompleteError: when an append fails after others succeeded; re-running completes it.
    """
    held_import, already, todo = await _survey(store, plan)
    written: list[str] = []
    appended = 0
    try:
        if held_import == 0:
            await store.append(plan.stream, [plan.started], NO_STREAM)
            appended += 1
        for batch in todo:
            await store.append(batch.stream, list(batch.events), NO_STREAM)
            written.append(batch.stream)
            appended += len(batch.events)
        if held_import < 2:
            await store.append(plan.stream, [plan.completed], 1)
            appended += 1
    except LoopdError as e:
        done = [plan.stream + " (import.started)"] if held_import or appended else []
        done += already + written
        raise ImportIncompleteError(
            f"import of {plan.directory} stopped: {e}; already in the log: {', '.join(done) or 'nothing'}; "
            f"not yet: {', '.join(b.stream for b in todo if b.stream not in written)}; run the same "
            "`loopd-es import-loopd` again to finish it (it appends only what is missing)"
        ) from e
    return ImportResult(written=tuple(written), already=tuple(already), appended_events=appended)


async def survey_plan(store: LogStore, plan: ImportPlan) -> ImportResult:
    """What :func:`apply_plan` would append, without appending (``import-loopd --dry-run``): the streams it
    would write and those the log holds already, and how many events.

    :raises ImportConflictError: as :func:`apply_plan` would.
    """
    held_import, already, todo = await _survey(store, plan)
    appended = (held_import == 0) + (held_import < 2) + sum(len(b.events) for b in todo)
    return ImportResult(
        written=tuple(b.stream for b in todo), already=tuple(already), appended_events=appended
    )


async def _survey(store: LogStore, plan: ImportPlan) -> tuple[int, list[str], list[StreamBatch]]:
    """How many of the import stream's two events the log holds, the streams it holds whole, the rest."""
    held_import = await _held(store, plan.stream, (plan.started, plan.completed))
    todo: list[StreamBatch] = []
    already: list[str] = []
    for batch in plan.batches:
        held = await _held(store, batch.stream, batch.events)
        if held == len(batch.events):
            already.append(batch.stream)
        else:
            todo.append(batch)
    return held_import, already, todo


async def _held(store: LogStore, stream: str, events: tuple[NewEvent, ...]) -> int:
    """How many of ``events`` the stream already holds as its first events (0 when it does not exist).

    :raises ImportConflictError: when the stream's first events are anything else.
    """
    version = await store.stream_version(stream)
    if version == 0:
        return 0
    count = 0
    async for env in store.read_stream(stream):
        if count >= len(events):
            break  # later events (a reconciliation, work continued after the import) are not the import's
        if env.event_id != events[count].event_id or not env.same_content(events[count], stream):
            raise ImportConflictError(
                f"stream {stream!r} already holds other events (version {version}, first difference at "
                f"version {env.version}): the project changed since it was imported, or the stream was "
                "written by something else; nothing was imported - import into a fresh log, or leave it"
            )
        count += 1
    return count
