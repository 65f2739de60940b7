"""Pure deciders for ``/loop`` tasks: each takes the session state and outside facts, returns events.

Nothing here reads a clock, a file or a random source: ``now``, the uniform draw ``u`` and ``loop.md``'s
content are arguments, and the chosen times are written into the events (see :mod:`.model`). Times are aware
UTC datetimes; the slot arithmetic (grid, jitter, fallback, clamp) runs on integer epoch milliseconds, the unit
the reference defines it in, converted at this module's edge with :func:`loopd_es.clock.to_ms` and
:func:`loopd_es.clock.from_ms_held`.
"""

from __future__ import annotations

import functools
import hashlib
import math
from typing import TYPE_CHECKING, Final

import msgspec

from ...clock import EPOCH, from_ms_held, to_ms
from ...events import loop as ev
from ...events.base import Event
from . import jsclass, texts
from .grammar import Adaptive, Fixed, Maintenance
from .jitter import fallback_due, jitter_offset, normalise_bounds

if TYPE_CHECKING:
    from collections.abc import Iterable
    from datetime import datetime

    from .model import InFlight, SessionLoops, Task

_ALPHABET: Final = "abcdefghijklmnopqrstuvwxyz0123456789"


class Config(msgspec.Struct, frozen=True, kw_only=True):
    """The reference's defaults (docs/reference/loop-plugin.md#s0-2) plus how long a scheduler's fire record
    holds without a renewal (it renews it while its host call lasts); past that the fire counts as lost."""

    max_tasks: int = 50
    adaptive_min_ms: int = 60_000
    adaptive_max_ms: int = 3_600_000
    default_jitter: bool = True
    claim_ttl_ms: int = 60_000


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    """What a command decided: events to append, the user-visible message, the text the model gets.

    ``error`` is ``"usage"`` or ``"conflict"`` for a ``❌`` message (the CLI's exit codes 2 and 3).
    """

    events: list[Event] = msgspec.field(default_factory=list)
    message: str = ""
    model_prompt: str | None = None
    task_id: str | None = None
    error: str | None = None


class LoopFile(msgspec.Struct, frozen=True, kw_only=True):
    """``loop.md`` as read at command or fire time; ``content`` is ``None`` when missing or empty."""

    path: str | None
    content: str | None


def task_id_for(origin_id: str) -> str:
    """The task id for a creating message: 8 characters of ``a-z0-9``, the same in every instance."""
    n = int.from_bytes(hashlib.sha256(origin_id.encode()).digest()[:8], "big")
    out = []
    for _ in range(8):
        n, r = divmod(n, 36)
        out.append(_ALPHABET[r])
    return "".join(out)


def content_hash(content: str) -> str:
    """First 16 hex characters of SHA-256 of the trimmed ``loop.md`` text (docs/reference/loop-plugin.md#s1-1;
    JavaScript's trim)."""
    return hashlib.sha256(jsclass.trim(content).encode()).hexdigest()[:16]


def _fixed_next_ms(task_id: str, interval_ms: int, at_ms: int, jitter: bool | None) -> tuple[int, int]:
    offset = jitter_offset(task_id, interval_ms, at_ms) if jitter is not False else 0
    return at_ms + interval_ms + offset, offset


def fixed_next(task_id: str, interval_ms: int, at: datetime, jitter: bool | None) -> tuple[datetime, int]:
    """``(due, offset)`` one interval after ``at``, jittered unless jitter is off (absent means on)."""
    due, offset = _fixed_next_ms(task_id, interval_ms, to_ms(at), jitter)
    return from_ms_held(due), offset


def _grid_ms(task: Task, cycle: int) -> tuple[int, int]:
    period = task.period_ms
    assert period is not None
    base = to_ms(task.anchor) + cycle * period
    if task.mode == "maintenance":
        return base + period, 0
    return _fixed_next_ms(task.task_id, period, base, task.jitter)


def grid_due(task: Task, cycle: int) -> tuple[datetime, int]:
    """``(due, offset)`` of grid step ``cycle`` of a fixed or maintenance task: no drift, jitter per slot."""
    due, offset = _grid_ms(task, cycle)
    return from_ms_held(due), offset


# -- creation -------------------------------------------------------------------------------------------


def create(
    s: SessionLoops,
    parsed: Fixed | Adaptive | Maintenance,
    *,
    origin_id: str,
    now: datetime,
    u: float,
    total_live: int,
    cfg: Config,
    owner: str | None = None,
    durable: bool = True,
    directory: str = "",
    via: ev.Via = "slash",
    loop_file: LoopFile | None = None,
) -> Outcome:
    """Schedule a task (docs/reference/loop-plugin.md#s1-2); a second call for the same ``origin_id`` returns
    the first task."""
    existing = s.by_origin(origin_id)
    if existing is not None:
        if not _same_request(existing, parsed):
            return Outcome(
                message=texts.failed(texts.origin_reused(origin_id, existing.task_id)), error="conflict"
            )
        if existing.cancelled is not None:
            return Outcome(
                message=texts.origin_ended(existing.task_id, existing.cancelled), task_id=existing.task_id
            )
        return Outcome(message=_started(existing, cfg), task_id=existing.task_id)
    if total_live >= cfg.max_tasks:
        return Outcome(message=texts.failed(texts.max_tasks(cfg.max_tasks)), error="conflict")
    tid = task_id_for(origin_id)
    new = functools.partial(
        ev.TaskCreated, task_id=tid, origin_id=origin_id, session_id=s.session_id, via=via, directory=directory,
        owner=owner, durable=durable, created_at=now,
    )  # fmt: skip
    at = to_ms(now)
    if isinstance(parsed, Fixed):
        jitter = parsed.jitter if parsed.jitter is not None else cfg.default_jitter
        iv = parsed.interval_ms
        if parsed.once:
            due, off, ran = (now if via == "slash" else from_ms_held(at + iv)), 0, False
        elif via == "tool":
            due, off, ran = from_ms_held(at + iv), 0, False
        else:
            (due, off), ran = fixed_next(tid, iv, now, jitter), True
        created = new(
            prompt=parsed.prompt, mode="fixed", interval_ms=iv, jitter=jitter, once=parsed.once,
            ran_on_creation=ran, next_due_at=due, jitter_offset_ms=off,
        )  # fmt: skip
        if parsed.once or via == "tool":
            prompt = texts.creation_confirmation(tid, iv, parsed.prompt, parsed.once)
        else:
            prompt = texts.first_run_prompt(tid, iv, parsed.prompt)
    elif isinstance(parsed, Adaptive):
        lo, hi = normalise_bounds(cfg.adaptive_min_ms, cfg.adaptive_max_ms)
        due = from_ms_held(fallback_due(at, lo, hi, u))
        created = new(
            prompt=parsed.prompt, mode="adaptive", adaptive_min_ms=lo, adaptive_max_ms=hi,
            ran_on_creation=via == "slash", next_due_at=due, fallback_u=u,
        )  # fmt: skip
        prompt = texts.adaptive_prompt(tid, parsed.prompt, due, lo, hi)
    else:
        hi = cfg.adaptive_max_ms
        content = loop_file.content if loop_file is not None else None
        text = jsclass.trim(content) if content else texts.DEFAULT_MAINTENANCE
        created = new(
            prompt=text, mode="maintenance", adaptive_max_ms=hi, source="default",
            loop_file_path=loop_file.path if loop_file is not None and content else None,
            content_hash=content_hash(content) if content else None,
            ran_on_creation=via == "slash", next_due_at=from_ms_held(at + hi),
        )  # fmt: skip
        prompt = text
    task_msg = _started_from(created)
    return Outcome(events=[created], message=task_msg, model_prompt=prompt, task_id=tid)


def _started_from(e: ev.TaskCreated) -> str:
    if e.mode == "fixed":
        assert e.interval_ms is not None
        return texts.started_fixed(e.interval_ms, e.prompt, e.task_id, e.session_id, e.once)
    if e.mode == "adaptive":
        return texts.started_adaptive(
            e.adaptive_min_ms or 0, e.adaptive_max_ms or 0, e.prompt, e.task_id, e.session_id
        )
    return texts.started_maintenance(e.adaptive_max_ms or 0, e.task_id, e.session_id)


def _same_request(t: Task, parsed: Fixed | Adaptive | Maintenance) -> bool:
    """Whether ``parsed`` asks for the task ``t`` its message created (a maintenance task's text comes from
    loop.md, which may have changed since, so only its mode counts)."""
    if isinstance(parsed, Fixed):
        return (t.mode, t.interval_ms, t.prompt, t.once) == (
            "fixed",
            parsed.interval_ms,
            parsed.prompt,
            parsed.once,
        ) and (parsed.jitter is None or parsed.jitter == t.jitter)
    if isinstance(parsed, Adaptive):
        return (t.mode, t.prompt) == ("adaptive", parsed.prompt)
    return t.mode == "maintenance"


def _started(t: Task, cfg: Config) -> str:
    if t.mode == "fixed":
        return texts.started_fixed(t.interval_ms or 0, t.prompt, t.task_id, t.session_id, t.once)
    if t.mode == "adaptive":
        return texts.started_adaptive(
            t.adaptive_min_ms or 0, t.adaptive_max_ms or 0, t.prompt, t.task_id, t.session_id
        )
    return texts.started_maintenance(t.adaptive_max_ms or cfg.adaptive_max_ms, t.task_id, t.session_id)


# -- management -----------------------------------------------------------------------------------------


def _find(s: SessionLoops, task_id: str) -> Task | None:
    t = s.tasks.get(task_id)
    return t if t is not None and t.live else None


def rearm(t: Task, now: datetime, u: float, cfg: Config) -> tuple[datetime, int, float | None]:
    """``(next_due, jitter_offset, fallback_u)`` re-armed from ``now`` per mode (resume,
    docs/reference/loop-plugin.md#s3-2)."""
    if t.mode == "fixed":
        due, off = fixed_next(t.task_id, t.interval_ms or 0, now, t.jitter)
        return due, off, None
    if t.mode == "adaptive":
        lo, hi = normalise_bounds(t.adaptive_min_ms, t.adaptive_max_ms)
        return from_ms_held(fallback_due(to_ms(now), lo, hi, u)), 0, u
    return from_ms_held(to_ms(now) + (t.adaptive_max_ms or cfg.adaptive_max_ms)), 0, None


def manage(
    s: SessionLoops,
    action: str,
    task_id: str | None,
    *,
    now: datetime,
    u: float,
    cfg: Config,
    by: str = "user",
) -> Outcome:
    """``cancel``, ``pause``, ``resume``, ``stop-all`` or ``list`` on the caller's own session only."""
    if action == "list":
        return Outcome(message=list_text(s))
    if action == "stop-all":
        live = s.live()
        events: list[Event] = [
            ev.TaskCancelled(task_id=t.task_id, reason="user", at=now, by=by) for t in live
        ]
        return Outcome(events=events, message=texts.cancelled_n(len(live)))
    assert task_id is not None
    t = _find(s, task_id)
    if t is None:
        return Outcome(message=texts.no_task(task_id), error="usage")
    if action == "cancel":
        return Outcome(
            events=[ev.TaskCancelled(task_id=t.task_id, reason="user", at=now, by=by)],
            message=texts.cancelled(t.task_id), task_id=t.task_id,
        )  # fmt: skip
    if action == "pause":
        events = [] if t.paused else [ev.TaskPaused(task_id=t.task_id, at=now, by=by)]
        return Outcome(events=events, message=texts.paused(t.task_id), task_id=t.task_id)
    if not t.paused:  # resuming an active task changes nothing (the reference silently postponed it)
        return Outcome(message=texts.resumed(t.task_id), task_id=t.task_id)
    due, off, fu = rearm(t, now, u, cfg)
    resumed = ev.TaskResumed(
        task_id=t.task_id, at=now, by=by, next_due_at=due, jitter_offset_ms=off, fallback_u=fu
    )
    return Outcome(events=[resumed], message=texts.resumed(t.task_id), task_id=t.task_id)


def list_text(s: SessionLoops) -> str:
    live = s.live()
    if not live:
        return texts.NO_LIST
    rows = [
        texts.list_row(
            t.task_id, t.paused, t.mode, t.interval_ms, t.once, t.adaptive_min_ms, t.adaptive_max_ms, t.prompt
        )
        for t in live
    ]
    return "\n".join([f"📋 {len(live)} loop task(s):", *rows, texts.LIST_FOOTER])


# -- firing ---------------------------------------------------------------------------------------------


def due_now(sessions: Iterable[SessionLoops], now: datetime) -> list[tuple[datetime, str, str]]:
    """``(due, session, task)`` of every task due at ``now``, soonest first: the plain definition of "due".

    :class:`~loopd_es.sched.due.DueIndex` answers the same question without looking at every task; this is
    what it must agree with (and what an engine without an index can call).
    """
    found = [
        (d, s.session_id, t.task_id)
        for s in sessions
        for t in s.tasks.values()
        if (d := t.due_at()) is not None and d <= now
    ]
    return sorted(found)


class Claim(msgspec.Struct, frozen=True, kw_only=True):
    """A decided claim: the events to append and, when ``text`` is set, what to inject into the session."""

    events: list[Event]
    slot: int
    attempt: int
    text: str | None


def _catch_up(t: Task, now: int) -> int:
    """The last grid step at or before ``now`` (epoch ms), from the pending one (``t.cycle``) on; no scan of long
    gaps."""
    period = t.period_ms
    assert period is not None
    c = max(t.cycle, math.floor((now - to_ms(t.anchor)) / period) - 2)
    if c > t.cycle and _grid_ms(t, c)[0] > now:
        c = t.cycle
    while _grid_ms(t, c + 1)[0] <= now:
        c += 1
    return c


def claim(
    s: SessionLoops, task_id: str, now: datetime, *, by: str, u: float, loop_file: LoopFile | None = None,
    session_idle: bool = True, in_flight: InFlight | None = None,
) -> Claim | None:  # fmt: skip
    """Take the due slot of ``task_id``, or ``None`` when it is not due or must wait.

    It waits while another fire of the session is in flight (``in_flight``: the session's live fire record,
    an outside fact) or the session is not idle (the user's turn). After downtime a grid task fires its latest
    due slot once and records the earlier ones as missed.
    """
    t = _find(s, task_id)
    due = t.due_at() if t is not None else None
    if t is None or due is None or due > now or not session_idle or _live(in_flight, now):
        return None
    events: list[Event] = []
    slot, attempt = t.next_slot, t.next_attempt
    next_due: datetime | None
    off, fu = 0, None
    if t.once:
        next_due = None
    elif t.mode == "adaptive":
        lo, hi = normalise_bounds(t.adaptive_min_ms, t.adaptive_max_ms)
        next_due, fu = from_ms_held(fallback_due(to_ms(now), lo, hi, u)), u
    else:
        last = _catch_up(t, to_ms(now))
        n = last - t.cycle
        if n:
            events.append(
                ev.SlotsMissed(task_id=t.task_id, n=n, first_slot=slot, last_slot=slot + n - 1, at=now)
            )
        slot += n
        if n:
            due = grid_due(t, last)[0]
        next_due, off = grid_due(t, last + 1)
    new_hash = new_prompt = None
    text: str | None
    if t.loop_file_path is not None:
        content = loop_file.content if loop_file is not None else None
        if not content:
            text = None
        elif content_hash(content) == t.content_hash:
            text = texts.maintenance_unchanged(t.task_id)
        else:
            new_hash, new_prompt = content_hash(content), jsclass.trim(content)
            text = texts.maintenance_changed(t.task_id, new_prompt)
    elif t.mode == "adaptive":
        lo, hi = normalise_bounds(t.adaptive_min_ms, t.adaptive_max_ms)
        text = texts.adaptive_prompt(t.task_id, t.prompt, next_due or now, lo, hi)
    else:
        text = texts.fire_text(t.task_id, t.prompt)
    events.append(
        ev.SlotClaimed(
            task_id=t.task_id, slot=slot, attempt=attempt, due_at=due, claimed_at=now, by=by,
            next_due_at=next_due, jitter_offset_ms=off, fallback_u=fu, content_hash=new_hash, prompt=new_prompt,
        )
    )  # fmt: skip
    if text is None:
        events.append(
            ev.FireFailed(
                task_id=t.task_id, slot=slot, attempt=attempt, at=now, reason="loop.md missing or empty"
            )
        )
    return Claim(events=events, slot=slot, attempt=attempt, text=text)


def close(
    t: Task, *, slot: int, attempt: int, now: datetime, error: str | None, prompt_id: str = ""
) -> list[Event]:
    """Record the outcome of a claimed slot; a one-shot ends on success and retries the slot on failure."""
    if error is None:
        done: list[Event] = [
            ev.FireSucceeded(task_id=t.task_id, slot=slot, attempt=attempt, at=now, prompt_id=prompt_id)
        ]
        if t.once and t.live:
            done.append(ev.TaskCancelled(task_id=t.task_id, reason="once-complete", at=now, by="scheduler"))
        return done
    retry = from_ms_held(to_ms(now) + (t.interval_ms or 0)) if t.once else None
    return [
        ev.FireFailed(task_id=t.task_id, slot=slot, attempt=attempt, at=now, reason=error, retry_at=retry)
    ]


def _live(in_flight: InFlight | None, now: datetime) -> bool:
    return in_flight is not None and in_flight.until > now


def lost_fires(s: SessionLoops, now: datetime, *, in_flight: InFlight | None) -> list[Event]:
    """``loop.fire_failed(claimer-lost)`` for every started fire that no live fire record names.

    Its scheduler stopped before recording an outcome (killed, or paused past its record). A one-shot retries
    the slot at once; a recurring task already chose its next slot when the fire started. Whoever appends these
    must hold the session's fire record first (taken over), so the lost scheduler can land nothing after them.
    """
    out: list[Event] = []
    for t in s.started():
        f = t.firing
        assert f is not None
        if _live(in_flight, now) and in_flight is not None and in_flight.names(t.task_id, f):
            continue
        out.append(ev.FireFailed(task_id=t.task_id, slot=f.slot, attempt=f.attempt, at=now, reason="claimer-lost",
                                 retry_at=now if t.once and t.live else None))  # fmt: skip
    return out


def sweep(s: SessionLoops, now: datetime, *, leases: dict[str, datetime], runner: str | None) -> list[Event]:
    """Housekeeping of one session: idle expiry, dead owners (ephemeral) and adoption (durable).

    ``leases`` maps an owner to its lease expiry; an owner without one is dead. Lost fires are
    :func:`lost_fires` (they need the session's fire record).
    """
    out: list[Event] = []
    for t in s.live():
        if t.expires_at() <= now:
            out.append(ev.TaskCancelled(task_id=t.task_id, reason="expired", at=now, by="scheduler"))
            continue
        if t.owner is None or leases.get(t.owner, EPOCH) > now:
            continue
        if not t.durable:
            out.append(ev.TaskCancelled(task_id=t.task_id, reason="owner-dead", at=now, by="scheduler"))
        elif runner is not None and runner != t.owner:
            out.append(ev.TaskAdopted(task_id=t.task_id, owner=runner, previous_owner=t.owner, at=now))
    return out


def sweep_at(
    t: Task, leases: dict[str, datetime], in_flight: InFlight | None, *, runner: str | None
) -> datetime | None:
    """The earliest time :func:`sweep` or :func:`lost_fires` would do something for task ``t`` (for ``runner``,
    as :func:`sweep` takes it: a dead owner's durable task matters only to a runner that would adopt it)."""
    times = []
    if t.firing is not None:  # lost when no record names it; a record naming another fire must run out first
        times.append(in_flight.until if in_flight is not None else EPOCH)
    if t.live:
        times.append(t.expires_at())
        if t.owner is not None and (not t.durable or (runner is not None and runner != t.owner)):
            times.append(leases.get(t.owner, EPOCH))
    return min(times) if times else None
