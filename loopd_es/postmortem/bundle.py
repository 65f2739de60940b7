"""``loopd-es bundle``: one shareable file with a goal's story, redacted.

It holds the goal's stream and its linked streams (switch sagas, commands, notifications; from a stream other
goals share, only this goal's events), every payload passed through the :class:`~.redact.Redactor`, the HTML
timeline drawn from those redacted events (so the page cannot say more than the events), and the redaction
report. :mod:`loopd_es.log.bundle` reads it back as a read-only log.
"""

from __future__ import annotations

import heapq
import uuid
from typing import TYPE_CHECKING, Any, Final

import anyio.to_thread
import msgspec

from ..clock import now_rfc3339
from ..log.bundle import BundleHeader, write_bundle

if TYPE_CHECKING:
    from pathlib import Path

    from ..events.envelope import Envelope
    from ..log.base import LogStore
    from .links import GoalStreams
    from .redact import Redactor

_ENCODER: Final = msgspec.json.Encoder()


class _GoalRef(msgspec.Struct):
    goal_id: str | None = None


_REF: Final = msgspec.json.Decoder(_GoalRef)


class BundleSummary(msgspec.Struct, frozen=True, kw_only=True):
    """What ``loopd-es bundle`` wrote."""

    path: str
    goal_id: str
    events: int
    streams: tuple[str, ...]
    bytes: int
    redaction: dict[str, Any]


async def goal_events(store: LogStore, goal: GoalStreams) -> list[Envelope]:
    """The goal's events in global order: its own streams whole, from a shared stream only the goal's events."""
    per_stream: list[list[Envelope]] = []
    for stream in goal.streams:
        events = [env async for env in store.read_stream(stream)]
        refs = [_REF.decode(env.data).goal_id for env in events]
        if any(ref not in (None, "", goal.goal_id) for ref in refs):  # shared: keep only ours
            events = [env for env, ref in zip(events, refs, strict=True) if ref == goal.goal_id]
        per_stream.append(events)
    return list(heapq.merge(*per_stream, key=lambda env: env.position))


_FORK_FACTS: Final = ("goal.forked", "goal.forked_from")


def redacted(events: list[Envelope], redactor: Redactor) -> list[Envelope]:
    """The events renumbered 1, 2, 3 ... (and each stream's versions), payloads redacted; ids and links kept.

    A fork fact's ``at_position``/``at_version`` name the fork point by the same numbers, so ``history`` of the
    bundle shows it where the bundle has it; a fork point the bundle does not hold (the source of a goal that
    is itself a fork) becomes position 0, which names no event (``at_event_id`` still names it).
    """
    places: dict[int, tuple[int, int]] = {}
    versions: dict[str, int] = {}
    for position, env in enumerate(events, 1):
        version = versions[env.stream] = versions.get(env.stream, 0) + 1
        places[env.position] = (position, version)
    out = []
    for env in events:
        position, version = places[env.position]
        data = env.data if redactor.off else _still_readable(env, redactor)
        if env.type in _FORK_FACTS:
            fact = msgspec.json.decode(data)
            fact["at_position"], fact["at_version"] = places.get(fact.get("at_position"), (0, 0))
            data = msgspec.Raw(_ENCODER.encode(fact))
        out.append(msgspec.structs.replace(env, position=position, version=version, data=data))
    return out


def _still_readable(env: Envelope, redactor: Redactor) -> msgspec.Raw:
    """``env``'s payload redacted, refused when the redaction made a readable event unreadable (a rules
    pattern rewrote a status or a time): a bundle must not give other answers than its log.

    :raises UsageError: naming the event and what no longer decodes.
    """
    from ..errors import InvalidEventError, UsageError
    from ..events.catalogue import decode_data

    data = _ENCODER.encode(redactor.payload(env.data_dict()))
    try:
        decode_data(env.type, data, env.schema_version)
    except InvalidEventError as after:
        try:
            decode_data(env.type, bytes(env.data), env.schema_version)
        except InvalidEventError:
            return msgspec.Raw(data)  # unreadable (or unknown) in the log too: the bundle says no more
        raise UsageError(
            f"redaction {redactor.report().mode} would make event {env.position} ({env.type}) unreadable "
            f"({after}); no bundle written - narrow the rules file's patterns"
        ) from None
    return msgspec.Raw(data)


async def make_bundle(store: LogStore, goal: GoalStreams, path: Path, redactor: Redactor) -> BundleSummary:
    """Collect, redact, draw the timeline from the redacted events, and write the bundle at ``path``."""
    from ..log.memory import MemoryLog
    from .explain import explain
    from .history import build_history
    from .links import find_goal
    from .timeline_html import render_html

    events = redacted(await goal_events(store, goal), redactor)
    streams = tuple(dict.fromkeys(env.stream for env in events))
    name = f"bundle-{uuid.uuid4()}"
    try:
        async with await MemoryLog.open(name) as scratch:

            async def copy() -> Any:
                yield events

            await scratch.import_envelopes(copy())
            found = await find_goal(scratch, goal.goal_id)
            history = await build_history(scratch, found, provenance=True)
            html = render_html(history, await explain(scratch, history))
    finally:
        MemoryLog.forget(name)
    report = msgspec.to_builtins(redactor.report())
    header = BundleHeader(
        goal_id=goal.goal_id,
        created_at=now_rfc3339(),
        events=len(events),
        streams=streams,
        redaction=report,
        timeline_html=html,
    )
    size = await anyio.to_thread.run_sync(write_bundle, path, header, events)
    return BundleSummary(
        path=str(path),
        goal_id=goal.goal_id,
        events=len(events),
        streams=streams,
        bytes=size,
        redaction=report,
    )
