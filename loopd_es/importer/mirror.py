"""A live mirror of a running opencode-loopd project: each pass appends what the log does not hold yet.

One pass reads the project with :func:`.plan.build_plan`, the one-shot import's reader and mapper. When the
log holds nothing of the project and the snapshot has settled, the pass *is* the one-shot import
(:func:`.plan.apply_plan`: the same events, byte for byte, as ``loopd-es import-loopd``). On a project
loopd keeps busy (``state.json`` never quiet for ``settle`` seconds) the first pass does not wait for a
quiet moment that may never come: it writes ``import.started`` and the ledger's facts, as every later pass
does, and the snapshot's part follows once it settles. Afterwards each pass continues every stream from
what the log holds:

- a goal stream folds its held events and maps the ledger lines after the last one it holds
  (:func:`.goals.continue_goal`: the same per-line mapping as the import);
- a command or control stream appends the events of the ledger lines after the last one it holds;
- a stream the log does not have yet starts (a goal from its ``goal.created`` line).

What the log holds is the checkpoint: every imported event names its ledger line (``ledger:<n>``), so a
mirror killed at any point resumes without duplicates or gaps, and one pass lands atomically
(:meth:`LogStore.append_many`) or not at all. Lines are numbered across rotated segments
(:mod:`.segments`), and a torn last line is left for the pass that sees it whole.

loopd writes ``state.json`` a few milliseconds before the ledger line that says why; the snapshot's
corrections (and a command or goal known only from the snapshot) therefore wait until ``state.json`` has
been quiet for ``settle`` seconds, so they never pre-empt a line that is about to arrive. A torn last line
is such a line still being written, however quiet ``state.json`` is: while the ledger ends in one, the
snapshot waits (for ``TORN_FACTOR`` times ``settle`` of a quiet ledger, the sign of a writer that died
mid-line).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Final

import anyio
import anyio.to_thread
import msgspec

from ..clock import WALL, Clock, from_us
from ..errors import ConflictError, LoopdError
from ..events.catalogue import decode_data, decode_payload
from ..events.envelope import NO_STREAM
from ..events.imported import STREAM_PREFIX, stamped
from ..log.base import StreamWrite
from .builder import Emitted, Report
from .goals import continue_goal
from .plan import ImportPlan, apply_plan, build_plan, import_id_for, stream_batch
from .source import LOOPD_DIR, ImportSourceError

if TYPE_CHECKING:
    from ..events.base import Event
    from ..events.envelope import Envelope, NewEvent
    from ..log.base import LogStore

SETTLE: Final = 0.5
"""Seconds ``state.json`` must be unchanged before its corrections are mirrored (loopd's ledger line
follows its state write within milliseconds)."""
TORN_FACTOR: Final = 20
"""While the ledger ends in a torn line, the snapshot settles only after the ledger too has been unchanged
for this many times ``settle``: the line explaining the latest state write is still arriving."""


class MirrorPass(msgspec.Struct, frozen=True, kw_only=True):
    """What one pass appended, and whether the snapshot's part waits for ``state.json`` to settle."""

    import_id: str
    stream: str
    imported: bool
    """True when this pass was the one-shot import (the log held nothing of the project)."""
    appended: int
    streams: tuple[str, ...]
    ledger_lines: tuple[int, ...]
    """Ledger lines (numbered across rotated segments) whose events this pass appended."""
    ledger_count: int
    settle_in: float | None = None
    """Seconds until the snapshot counts as settled, when its part of this pass was left for later."""
    torn_line: int | None = None


class _Held(msgspec.Struct, frozen=True):
    ids: tuple[str, ...]
    items: list[Emitted]
    last_line: int


class MirrorCache:
    """The streams as this mirror last left them, trusted while the log's head is where it left it.

    A following mirror keeps one, so a pass reads only the project, not every mirrored stream again:
    a pass then costs what changed, plus one read of the project's files.
    """

    def __init__(self) -> None:
        self.head = -1
        self.held: dict[str, _Held] = {}
        self.settled_sha = ""
        """``state.json``'s hash at the last settled pass: an unchanged snapshot has nothing to correct."""

    def forget(self) -> None:
        self.head, self.settled_sha = -1, ""
        self.held.clear()


async def mirror_pass(
    store: LogStore,
    directory: Path,
    *,
    settle: float = 0.0,
    clock: Clock = WALL,
    cache: MirrorCache | None = None,
) -> MirrorPass:
    """Append every fact of the project at ``directory`` that the log does not hold yet.

    ``settle`` 0 (a one-shot run) takes the snapshot as it is.

    :raises ImportSourceError: when the project cannot be read (as ``import-loopd``).
    :raises ImportConflictError: when the log holds other events on a stream the import would write.
    :raises WrongExpectedVersionError: when something else appended to a mirrored stream meanwhile.
    """
    cache = cache if cache is not None else MirrorCache()
    first = await store.stream_version(STREAM_PREFIX + import_id_for(directory)) == 0
    plan = await anyio.to_thread.run_sync(partial(build_plan, directory, map_goals=first))
    settle_in = _settle_in(directory, settle, clock, torn=plan.torn_line is not None)
    settled = settle_in is None
    base = partial(MirrorPass, import_id=plan.import_id, stream=plan.stream, ledger_count=plan.ledger_count)
    if first and not settled:
        # loopd is busy: start with what the ledger says; the snapshot's part waits as in any later pass
        plan = msgspec.structs.replace(
            plan, batches=tuple(b for b in plan.batches if not b.stream.startswith("goal-"))
        )
    elif first:
        result = await apply_plan(store, plan)
        lines = {_line(s) for b in plan.batches if b.stream in result.written for s in b.sources}
        return base(
            imported=True,
            appended=result.appended_events,
            streams=result.written,
            ledger_lines=tuple(sorted(n for n in lines if n)),
            torn_line=plan.torn_line,
        )
    head = await store.head()
    if head != cache.head:
        cache.forget()  # something else wrote: read the streams again
    try:
        writes, lines, after = await _continue(store, plan, settled, cache)
        if first:  # in the same atomic append: a pass killed before it lands leaves nothing
            writes.insert(0, StreamWrite(plan.stream, [plan.started], NO_STREAM))
        if writes:
            landed = [env.position for envs in await store.append_many(writes) for env in envs]
            # trusted only if nothing else landed between the head read and this append
            head = max(landed) if min(landed) == head + 1 else -1
    except BaseException:
        cache.forget()
        raise
    cache.held.update(after)
    cache.head = head
    if settled:
        cache.settled_sha = plan.state_sha256
    return base(
        imported=False,
        appended=sum(len(w.events) for w in writes if w.stream != plan.stream),
        streams=tuple(w.stream for w in writes if w.stream != plan.stream),
        ledger_lines=tuple(sorted(lines)),
        settle_in=settle_in,
        torn_line=plan.torn_line,
    )


async def _continue(
    store: LogStore, plan: ImportPlan, settled: bool, cache: MirrorCache
) -> tuple[list[StreamWrite], set[int], dict[str, _Held]]:
    """Each stream's events after what the log holds (goal streams re-mapped, others by ledger line),
    and the streams as they will be once those land."""
    writes: list[StreamWrite] = []
    lines: set[int] = set()
    after: dict[str, _Held] = {}
    started = plan.started.event_id
    snapshot_seen = settled and cache.settled_sha == plan.state_sha256
    for data in plan.goal_inputs:
        stream = f"goal-{data.goal_id}"
        held = await _held(store, stream, cache)
        if not any(ln.line > held.last_line for ln in data.lines) and (not settled or snapshot_seen):
            continue  # no new line, and no snapshot this stream has not been brought to yet
        items = continue_goal(data, held.items, Report(), settled=settled)
        if len(items) > len(held.items):
            batch = stream_batch(plan.import_id, plan.stream, started, stream, items, held.ids)
            writes.append(StreamWrite(stream, batch.events, len(held.ids) or NO_STREAM))
            lines.update(map(_line, batch.sources))
            after[stream] = _Held(
                held.ids + tuple(e.event_id for e in batch.events),
                items,
                max(held.last_line, *map(_line, batch.sources)),
            )
    for batch in plan.batches:
        held = await _held(store, batch.stream, cache)
        pairs = list(zip(batch.events, batch.sources, strict=True))
        if not held.ids:
            new = pairs if settled else pairs[: _through_last_line(batch.sources)]
        else:
            have = [i.payload for i in held.items]
            new = [
                (e, src)
                for e, src in pairs
                if _line(src) > held.last_line
                or (settled and not _line(src) and decode_payload_of(e) not in have)
            ]
        if new:
            writes.append(StreamWrite(batch.stream, [e for e, _ in new], len(held.ids) or NO_STREAM))
            lines.update(_line(src) for _, src in new)
            added = [Emitted(decode_payload_of(e), src) for e, src in new]
            after[batch.stream] = _Held(
                held.ids + tuple(e.event_id for e, _ in new),
                held.items + added,
                max(held.last_line, *(_line(src) for _, src in new)),
            )
    lines.discard(0)
    _check_not_shrunk(plan, list(cache.held.values()))  # every stream this pass (or a recent one) read
    return writes, lines, after


def _check_not_shrunk(plan: ImportPlan, held: list[_Held]) -> None:
    """Refuse a ledger shorter than what was mirrored of it: truncated or replaced in place, its new lines
    carry numbers already mirrored, and a pass would take them for mirrored and skip them for good.

    :raises ImportSourceError: naming the ledger, its line count and the last line mirrored.
    """
    mirrored = max((h.last_line for h in held), default=0)
    if mirrored > plan.ledger_count:
        raise ImportSourceError(
            plan.directory / LOOPD_DIR / "events.ndjson",
            f"the ledger has {plan.ledger_count} line(s), but line {mirrored} was mirrored already: it was "
            "truncated or replaced in place (copytruncate is not supported; rotate by renaming, see "
            "docs), so its new lines would be skipped; restore it, or mirror into a fresh log",
        )


async def _held(store: LogStore, stream: str, cache: MirrorCache) -> _Held:
    """The stream as the log holds it: ids, events as the builder's items, last ledger line mirrored."""
    known = cache.held.get(stream)
    if known is not None:
        return known
    ids: list[str] = []
    items: list[Emitted] = []
    if await store.stream_version(stream):
        async for env in store.read_stream(stream):
            ids.append(env.event_id)
            items.append(_emitted(env))
    held = _Held(tuple(ids), items, max((_line(i.source) for i in items), default=0))
    cache.held[stream] = held
    return held


def _emitted(env: Envelope) -> Emitted:
    at, provenance = stamped(env.data)
    source = provenance.source if provenance is not None else ""
    return Emitted(decode_payload(env), source, at or "", provenance.time_from if provenance else "")


def _through_last_line(sources: tuple[str, ...]) -> int:
    """How many of a new stream's events to write before the snapshot settles: through its last ledger line."""
    return max((i + 1 for i, src in enumerate(sources) if _line(src)), default=0)


def decode_payload_of(event: NewEvent) -> Event:
    """A new event's payload as its typed event (without the import's stamp, which readers ignore)."""
    return decode_data(event.type, event.data_bytes())


def _line(source: str) -> int:
    """The ledger line of an event's source (``ledger:12`` -> 12), 0 for one synthesised from state.json."""
    return int(source[7:]) if source.startswith("ledger:") else 0


def _settle_in(directory: Path, settle: float, clock: Clock, *, torn: bool) -> float | None:
    """None when ``state.json`` has been unchanged for ``settle`` seconds (and, with a ``torn`` ledger
    tail, the ledger for ``TORN_FACTOR`` times that), else the seconds left."""
    if settle <= 0:
        return None
    files = ["state.json", "events.ndjson"] if torn else ["state.json"]
    need = settle * TORN_FACTOR if torn else settle
    try:
        modified = from_us(max((directory / LOOPD_DIR / name).stat().st_mtime_ns for name in files) // 1000)
        age = (clock.now() - modified).total_seconds()
    except OSError:
        if torn:
            return settle  # rotated away meanwhile: the next pass looks again
        return None  # build_plan read it a moment ago; gone now means the next pass says so
    return None if age >= need else need - age


async def follow(
    store: LogStore,
    directory: Path,
    on_pass: Callable[[MirrorPass], Awaitable[None]],
    on_error: Callable[[LoopdError], Awaitable[None]],
    *,
    settle: float = SETTLE,
    poll: float = 5.0,
    cache: MirrorCache | None = None,
) -> None:
    """Run a pass now and after every change to the project's ledger or snapshot, until cancelled.

    A pass that fails (a state file loopd is rewriting without its atomic rename, a mirrored stream
    someone else appended to) is reported through ``on_error`` and tried again at the next change;
    ``poll`` seconds is the longest wait, in case a change was not reported. Until a first pass has
    succeeded (the one run before watching starts) its error is raised instead: a directory that is no
    loopd project stops the mirror at once.

    :raises ImportSourceError: when the first pass cannot read the project.
    :raises ConflictError: when the first pass finds the log holding other events on its streams.
    """
    from ..projector.watch import Waker, watch_log

    base = directory / LOOPD_DIR
    cache = cache if cache is not None else MirrorCache()
    # the first pass outside the task group: its error reaches the caller as itself, not in a group
    await on_pass(await mirror_pass(store, directory, settle=settle, cache=cache))
    waker = Waker()
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        files = [base / "state.json", base / "events.ndjson"]
        tg.start_soon(partial(watch_log, files, waker, stop, debounce=0, step=5))
        try:
            while True:  # a pass at once too: a change before the watcher started is not left to the poll
                wait = poll
                try:
                    done = await mirror_pass(store, directory, settle=settle, cache=cache)
                except (ImportSourceError, ConflictError) as e:
                    await on_error(e)
                else:
                    await on_pass(done)
                    if done.settle_in is not None:
                        wait = min(wait, done.settle_in + 0.01)
                await waker.wait(wait)
        finally:
            stop.set()
            tg.cancel_scope.cancel()
