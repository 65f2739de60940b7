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

from ..errors import ConflictError, LoopdError, StorageError
from ..events.catalogue import new_event
from ..events.envelope import NO_STREAM
from ..events.imported import STREAM_PREFIX, ImportCompleted, ImportedEvent, ImportedStream, ImportStarted
from ..ids import InvalidIdError, is_valid_id
from .check import differences
from .commands import build_commands
from .goals import GoalInput, build_goal
from .source import LOOPD_DIR, ImportSourceError, LedgerLine, load_ledger, load_state

if TYPE_CHECKING:
    from ..events.envelope import NewEvent
    from ..log.base import LogStore
    from .builder import Emitted
    from .source import LoadedLedger, LoadedState

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


def build_plan(directory: Path) -> ImportPlan:
    """Read, validate and map a loopd project; no I/O besides reading its two files.

    :raises ImportSourceError: for a missing directory or a corrupt ``state.json`` / ``events.ndjson``.
    """
    if not directory.is_dir():
        raise ImportSourceError(directory, "no such directory")
    base = directory / LOOPD_DIR
    loaded = load_state(base / "state.json")
    ledger = load_ledger(base / "events.ndjson")
    _check_ids(loaded, ledger)
    state = loaded.state
    warnings: list[str] = []
    if ledger.torn_line is not None:
        warnings.append(
            f"{ledger.path} line {ledger.torn_line} is an incomplete write (no newline, not JSON); skipped"
        )
    goal_lines: dict[str, list[LedgerLine]] = {}
    command_lines: list[LedgerLine] = []
    for line in ledger.lines:
        if line.type.startswith("command."):
            command_lines.append(line)
        elif line.goal_id:
            goal_lines.setdefault(line.goal_id, []).append(line)
    runtimes = {rt.goal_id: rt for rt in state.runtimes}
    snaps = {goal.id: goal for goal in state.goals}
    mapped: list[tuple[str, list[Emitted]]] = []
    for goal_id in [*snaps, *(k for k in goal_lines if k not in snaps)]:
        data = GoalInput(
            goal_id=goal_id,
            goal=snaps.get(goal_id),
            runtime=runtimes.get(goal_id),
            lines=tuple(goal_lines.get(goal_id, ())),
            ledger_path=ledger.path,
        )
        items = build_goal(data, warnings)
        snap = snaps.get(goal_id)
        if snap is not None:
            warnings.extend(f"goal {goal_id}: {d}" for d in differences(snap, runtimes.get(goal_id), items))
        if items:
            mapped.append((f"goal-{goal_id}", items))
    commands = build_commands(state.commands, state.command_awaits, command_lines, ledger.path, warnings)
    mapped.extend((f"command-{cid}", items) for cid, items in commands.items() if items)

    import_id = import_id_for(directory)
    stream = f"{STREAM_PREFIX}{import_id}"
    started_payload = ImportStarted(
        import_id=import_id,
        directory=str(directory.resolve()),
        state_version=loaded.source_version,
        state_revision=state.revision,
        state_sha256=loaded.sha256,
        ledger_lines=ledger.count,
        ledger_sha256=ledger.sha256,
        streams=tuple(name for name, _ in mapped),
    )
    started = new_event(
        started_payload, event_id=_event_id(import_id, stream, 0, "started"), correlation_id=stream
    )
    batches = tuple(_batch(import_id, stream, started.event_id, name, items) for name, items in mapped)
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
        skipped_ledger_lines=(ledger.torn_line,) if ledger.torn_line is not None else (),
        warnings=tuple(warnings),
    )
    completed = new_event(
        completed_payload,
        event_id=_event_id(import_id, stream, 1, "completed"),
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
    )


def _check_ids(loaded: LoadedState, ledger: LoadedLedger) -> None:
    """Refuse the whole import when any goal or command id could not safely be a stream or file name.

    :raises ImportSourceError: naming the file, the record and the id.
    """
    st, sp, lp = loaded.state, loaded.path, ledger.path
    checks = [
        *((sp, "goal", g.id, f"goals[{i}].id") for i, g in enumerate(st.goals)),
        *((sp, "goal", r.goal_id, f"runtimes[{i}].goalID") for i, r in enumerate(st.runtimes)),
        *((sp, "command", c.id, f"commands[{i}].id") for i, c in enumerate(st.commands)),
        *((sp, "goal", c.goal_id, f"commands[{i}].goalID") for i, c in enumerate(st.commands) if c.goal_id),
        *((sp, "goal", a.goal_id, f"commandAwaits[{i}].goalID") for i, a in enumerate(st.command_awaits)),
        *((sp, "command", a.command_id, f"commandAwaits[{i}].commandID") for i, a in enumerate(st.command_awaits)),
        *((lp, "goal", ln.goal_id, f"line {ln.line} goalID") for ln in ledger.lines if ln.goal_id),
        *((lp, "command", ln.command_id, f"line {ln.line} commandID") for ln in ledger.lines if ln.command_id),
    ]
    for path, kind, value, where in checks:
        if not is_valid_id(value):
            raise ImportSourceError(path, str(InvalidIdError(kind, value, where)))


def _event_id(import_id: str, stream: str, index: int, source: str) -> str:
    return str(uuid.uuid5(NAMESPACE, f"{import_id}/{stream}/{index}/{source}"))


def _batch(import_id: str, import_stream: str, cause: str, stream: str, items: list[Emitted]) -> StreamBatch:
    """Chain the stream: the first event is caused by ``import.started``, each later one by its predecessor."""
    events: list[NewEvent] = []
    for index, item in enumerate(items):
        event = new_event(
            item.payload,
            event_id=_event_id(import_id, stream, index, item.source),
            causation_id=cause,
            correlation_id=import_stream,
        )
        events.append(event)
        cause = event.event_id
    sources = tuple(item.source for item in items)
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
    held_import = await _held(store, plan.stream, (plan.started, plan.completed))
    todo: list[StreamBatch] = []
    already: list[str] = []
    for batch in plan.batches:
        held = await _held(store, batch.stream, batch.events)
        if held == len(batch.events):
            already.append(batch.stream)
        else:
            todo.append(batch)
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


async def _held(store: LogStore, stream: str, events: tuple[NewEvent, ...]) -> int:
    """How many of ``events`` the stream already holds as its first events (0 when it does not exist).

    :raises ImportConflictError: when the stream holds anything else.
    """
    version = await store.stream_version(stream)
    if version == 0:
        return 0
    count = 0
    async for env in store.read_stream(stream):
        if (
            count >= len(events)
            or env.event_id != events[count].event_id
            or not env.same_content(events[count], stream)
        ):
            raise ImportConflictError(
                f"stream {stream!r} already holds other events (version {version}, first difference at "
                f"version {env.version}): the project changed since it was imported, or the stream was "
                "written by something else; nothing was imported - import into a fresh log, or leave it"
            )
        count += 1
    return count
