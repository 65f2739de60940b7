"""The reference's two LLM tools, ``loop_schedule`` and ``loop_status`` (docs/reference/loop-plugin.md#s5),
over the same events.

Results are the reference's JSON objects (``{"ok": false, "error": ...}`` for business errors, strings
verbatim); the OpenCode tool channel serialises them. Everything is scoped to the calling session.
"""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

import msgspec
from msgspec import UNSET, Meta, UnsetType

from ..clock import from_ms_held, iso, to_ms
from ..domain.loop import decide, jsclass, texts
from ..domain.loop.grammar import Adaptive, Fixed, Maintenance
from ..domain.loop.jitter import MIN_INTERVAL_MS, clamp_due, fallback_due, js_round, normalise_bounds
from ..errors import DomainError, UsageError
from ..events import loop as ev
from .service import append_decided, create_task, read_session

if TYPE_CHECKING:
    from datetime import datetime

    from ..domain.loop.model import SessionLoops, Task
    from ..log.base import LogStore


_Ms = Annotated[float, Meta(ge=-(2**53), le=2**53)]
Action = Literal["create", "list", "cancel", "reschedule", "set_fixed", "pause", "resume"]


class LoopToolArgs(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A ``loop_schedule`` / ``loop_status`` call's arguments (docs/reference/loop-plugin.md#s5-1), decoded
    strictly: a prompt that is
    not a string, a number that is not one, or an unknown field is refused naming the field, never coerced.
    Messages the reference words itself (``prompt required``, ``intervalMs must be ...``) stay with the tool."""

    tool: Literal["loop_schedule", "loop_status"] | UnsetType = UNSET
    action: Action | UnsetType = UNSET
    taskId: str | UnsetType = UNSET
    prompt: Annotated[str, Meta(max_length=100_000)] | UnsetType = UNSET
    mode: Literal["fixed", "adaptive", "maintenance"] | UnsetType = UNSET
    intervalMs: _Ms | UnsetType = UNSET
    delayMs: _Ms | UnsetType = UNSET
    nextDueAtMs: _Ms | UnsetType = UNSET
    jitterEnabled: bool | UnsetType = UNSET
    once: bool | UnsetType = UNSET
    all: bool | UnsetType = UNSET
    """Ignored, as the reference ignores it: every answer is scoped to the calling session."""


def decode_call(call: object) -> dict[str, Any]:
    """``call`` checked against :class:`LoopToolArgs`; the arguments it gives (``null`` counts as absent).

    :raises UsageError: naming the field at fault.
    """
    given = {k: v for k, v in call.items() if v is not None} if isinstance(call, dict) else call
    try:
        args = msgspec.convert(given, type=LoopToolArgs, strict=True)
    except msgspec.ValidationError as e:
        raise UsageError(f"loop tool: {e}") from None
    if args.tool != "loop_status" and args.action is UNSET:  # the schema's one required field
        raise UsageError(f"loop tool: loop_schedule needs `action`, one of {', '.join(get_args(Action))}")
    return {k: v for k, v in msgspec.structs.asdict(args).items() if v is not UNSET}


def _due(at: datetime | None) -> str | None:
    """A task's next due time as the tools answer it: ``null`` for a task with none."""
    return None if at is None else iso(at)


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _interval_error(v: Any) -> str | None:
    n = _num(v)
    if n is None or not math.isfinite(n):
        return "intervalMs must be a finite number"
    if n < MIN_INTERVAL_MS:
        return "intervalMs must be at least 1000ms"
    return None


def _record(t: Task, prompt_cut: int = 200) -> dict[str, Any]:
    out: dict[str, Any] = {"id": t.task_id, "mode": t.mode, "sessionID": t.session_id}
    out["prompt"] = texts.cut(t.prompt, prompt_cut)
    pairs = (
        ("intervalMs", t.interval_ms),
        ("adaptiveMinMs", t.adaptive_min_ms),
        ("adaptiveMaxMs", t.adaptive_max_ms),
    )
    out.update({k: v for k, v in pairs if v is not None})
    out.update(paused=t.paused, createdAt=iso(t.created_at), lastFiredAt=_due(t.last_fired_at),
               nextDueAt=_due(t.next_due_at))  # fmt: skip
    return out


def _full_record(t: Task, cfg: decide.Config) -> dict[str, Any]:
    """A task as ``pause``, ``resume`` and ``cancel`` return it: every field of the reference's task record
    (docs/reference/loop-plugin.md#s1-1) in its order, times as epoch ms (``lastFiredAt`` 0 for never). A
    fixed task without its own jitter flag shows the default it runs with, as the reference writes it at
    creation. The reference's process fields (``ownerPid``, ``ownerStartedAt``) have no counterpart: runners
    claim each slot in the log instead."""
    out: dict[str, Any] = {"id": t.task_id, "prompt": t.prompt, "mode": t.mode}
    jitter = (cfg.default_jitter if t.jitter is None else t.jitter) if t.mode == "fixed" else None
    optional = (
        ("intervalMs", t.interval_ms),
        ("jitterEnabled", jitter),
        ("adaptiveMinMs", t.adaptive_min_ms),
        ("adaptiveMaxMs", t.adaptive_max_ms),
    )
    out.update({k: v for k, v in optional if v is not None})
    out["createdAt"] = to_ms(t.created_at)
    out["lastFiredAt"] = 0 if t.last_fired_at is None else to_ms(t.last_fired_at)
    out["nextDueAt"] = None if t.next_due_at is None else to_ms(t.next_due_at)
    out.update(source=t.source, directory=t.directory, sessionID=t.session_id, paused=t.paused)
    if t.once:
        out["once"] = True
    if t.loop_file_path is not None:
        out["loopFilePath"] = t.loop_file_path
        if t.content_hash is not None:
            out["lastContentHash"] = t.content_hash
    return out


def reschedule(
    s: SessionLoops, task_id: str, *, now: datetime, delay_ms: float | None, next_due_at_ms: float | None, u: float,
    cfg: decide.Config,
) -> tuple[decide.Outcome, dict[str, Any]]:  # fmt: skip
    """``reschedule`` (docs/reference/loop-plugin.md#s5-1): adaptive requests are clamped into the task's
    window; fixed ones are taken as given."""
    t = s.tasks.get(task_id)
    if t is None or not t.live:
        return decide.Outcome(), {"ok": False, "error": f"No task {task_id} in this session"}
    if delay_ms is not None and t.mode != "adaptive":
        return decide.Outcome(), {"ok": False, "error": "delayMs is supported only for Adaptive tasks"}
    fu: float | None = None
    n = to_ms(now)
    if t.mode == "adaptive":
        lo, hi = normalise_bounds(t.adaptive_min_ms, t.adaptive_max_ms)
        if delay_ms is not None:
            due = clamp_due(n, n + delay_ms, lo, hi)
        elif next_due_at_ms is not None:
            due = clamp_due(n, next_due_at_ms, lo, hi)
        else:
            due, fu = fallback_due(n, lo, hi, u), u
    else:
        lo, hi = normalise_bounds(cfg.adaptive_min_ms, cfg.adaptive_max_ms)
        due = math.floor(next_due_at_ms) if next_due_at_ms is not None else clamp_due(n, n + 300_000, lo, hi)
    requested = None if next_due_at_ms is None else from_ms_held(next_due_at_ms)
    e = ev.TaskRescheduled(
        task_id=t.task_id, at=now, requested_delay_ms=delay_ms, requested_next_due_at=requested,
        min_ms=lo, max_ms=hi, fallback_u=fu, next_due_at=from_ms_held(due),
    )  # fmt: skip
    result: dict[str, Any] = {"ok": True}
    if delay_ms is not None:
        result.update(requestedDelayMs=delay_ms, effectiveDelayMs=due - n)
    if requested is not None:
        result["requestedNextDueAt"] = iso(requested)
    result["task"] = {"id": t.task_id, "nextDueAt": iso(e.next_due_at)}
    return decide.Outcome(events=[e], task_id=t.task_id), result


def set_fixed(
    s: SessionLoops, task_id: str, *, now: datetime, interval_ms: float, jitter: bool | None
) -> tuple[decide.Outcome, dict[str, Any]]:
    """``set_fixed`` (docs/reference/loop-plugin.md#s5-1): an adaptive task becomes fixed, jitter off unless
    asked, grid anchored now."""
    t = s.tasks.get(task_id)
    if t is None or not t.live:
        return decide.Outcome(), {"ok": False, "error": f"No task {task_id} in this session"}
    if t.mode != "adaptive":
        return decide.Outcome(), {"ok": False, "error": "set_fixed requires an Adaptive task"}
    iv, on = js_round(interval_ms), bool(jitter)  # whole ms, rounded as /loop's intervals are
    due, off = decide.fixed_next(t.task_id, iv, now, on)
    e = ev.TaskConvertedToFixed(
        task_id=t.task_id, at=now, interval_ms=iv, jitter=on, jitter_offset_ms=off, next_due_at=due
    )
    task = {
        "id": t.task_id,
        "mode": "fixed",
        "intervalMs": iv,
        "jitterEnabled": on,
        "lastFiredAt": to_ms(now),
        "nextDueAt": iso(due),
    }
    return decide.Outcome(events=[e], task_id=t.task_id), {"ok": True, "task": task}


async def loop_schedule(
    store: LogStore, args: dict[str, Any], *, session_id: str | None, now: datetime, cfg: decide.Config,
    origin_id: str, u: float | None = None, directory: str = "",
) -> dict[str, Any]:  # fmt: skip
    """The ``loop_schedule`` tool: create, list, cancel, pause, resume, reschedule, set_fixed. ``directory``:
    the project a created task fires in (the reference's tool context directory)."""
    action = args.get("action")
    tid = args.get("taskId")
    draw = random.random() if u is None else u
    sid = session_id or ""
    if action == "reschedule" and args.get("delayMs") is not None and args.get("nextDueAtMs") is not None:
        return {"ok": False, "error": "delayMs and nextDueAtMs are mutually exclusive"}
    if action in ("cancel", "pause", "resume", "reschedule", "set_fixed") and not tid:
        return {"ok": False, "error": "taskId required"}
    if action == "list":
        s = await read_session(store, sid)
        tasks = [_record(t) for t in s.live()]
        return {"ok": True, "scope": sid, "count": len(tasks), "tasks": tasks}
    if action in ("cancel", "pause", "resume"):
        out = await append_decided(
            store,
            sid,
            lambda s: decide.manage(s, str(action), str(tid), now=now, u=draw, cfg=cfg, by="model"),
        )
        if out.error:
            return {"ok": False, "error": out.message.removeprefix("❌ ")}
        t = (await read_session(store, sid)).tasks[str(tid)]
        if action == "cancel":
            return {"ok": True, "removed": _full_record(t, cfg), "message": f"Cancelled {tid}"}
        return {"ok": True, "task": _full_record(t, cfg)}
    if action == "reschedule":
        box: dict[str, Any] = {}

        def resched(s: SessionLoops) -> decide.Outcome:
            out, box["r"] = reschedule(s, str(tid), now=now, delay_ms=_num(args.get("delayMs")),
                                       next_due_at_ms=_num(args.get("nextDueAtMs")), u=draw, cfg=cfg)  # fmt: skip
            return out

        await append_decided(store, sid, resched)
        return dict(box["r"])
    if action == "set_fixed":
        bad = _interval_error(args.get("intervalMs"))
        if bad:
            return {"ok": False, "error": bad}
        box2: dict[str, Any] = {}

        def fix(s: SessionLoops) -> decide.Outcome:
            out, box2["r"] = set_fixed(
                s, str(tid), now=now, interval_ms=float(args["intervalMs"]), jitter=args.get("jitterEnabled")
            )
            return out

        await append_decided(store, sid, fix)
        return dict(box2["r"])
    if action == "create":
        return await _create(store, args, sid, now, cfg, origin_id, draw, directory)
    return {"ok": False, "error": f"Unknown action: {action}"}


async def _create(
    store: LogStore,
    args: dict[str, Any],
    sid: str,
    now: datetime,
    cfg: decide.Config,
    origin_id: str,
    u: float,
    directory: str,
) -> dict[str, Any]:
    prompt = args.get("prompt")
    if not prompt:
        return {"ok": False, "error": "prompt required"}
    if not sid:
        return {"ok": False, "error": "No sessionID in context"}
    mode = args.get("mode") or ("fixed" if args.get("intervalMs") is not None else "adaptive")
    if mode == "fixed":
        bad = _interval_error(args.get("intervalMs"))
        if bad:
            return {"ok": False, "error": f"fixed mode requires {bad}"}
    elif args.get("intervalMs") is not None:
        return {"ok": False, "error": f"intervalMs is only valid for fixed tasks (mode={mode})"}
    if args.get("once") and mode != "fixed":
        return {"ok": False, "error": "once is supported only for fixed tasks"}
    if not jsclass.trim(str(prompt)):
        raise UsageError("prompt must be non-empty")  # thrown, as the reference's tool does
    spec: Fixed | Adaptive | Maintenance
    if mode == "fixed":
        jit = args.get("jitterEnabled")
        spec = Fixed(interval_ms=js_round(args["intervalMs"]), prompt=str(prompt), once=bool(args.get("once")),
                     jitter=jit if isinstance(jit, bool) else None, token="")  # fmt: skip
    elif mode == "adaptive":
        spec = Adaptive(prompt=str(prompt))
    else:
        spec = Maintenance()
    loop_file = decide.LoopFile(path=None, content=str(prompt)) if mode == "maintenance" else None
    out = await create_task(
        store, sid, spec, origin_id=origin_id, now=now, u=u, cfg=cfg, via="tool", loop_file=loop_file,
        directory=directory,
    )  # fmt: skip
    if out.error:
        raise DomainError(out.message.removeprefix("❌ /loop failed: "))
    t = (await read_session(store, sid)).tasks[str(out.task_id)]
    task: dict[str, Any] = {"id": t.task_id, "mode": t.mode, "sessionID": sid}
    if t.interval_ms is not None:  # a key JavaScript's JSON leaves out when undefined
        task["intervalMs"] = t.interval_ms
    task["nextDueAt"] = _due(t.next_due_at)
    return {
        "ok": True,
        "task": task,
        "message": f"Loop task created [id={t.task_id}] [s={jsclass.utf16_head(sid, 8)}]. Call loop_schedule(action='cancel', taskId='{t.task_id}') when done.",
    }


async def loop_status(store: LogStore, *, session_id: str | None) -> dict[str, Any]:
    """The ``loop_status`` tool: counts and tasks of the calling session."""
    sid = session_id or ""
    s = await read_session(store, sid)
    live = s.live()
    tasks = []
    for t in live:
        r = _record(t, 80)
        row = {k: r[k] for k in ("id", "mode", "sessionID", "prompt", "paused", "nextDueAt", "lastFiredAt")}
        if t.interval_ms is not None:
            row["intervalMs"] = t.interval_ms
        row["recentFires"] = [
            {"slot": slot, "outcome": outcome, "at": iso(at)} for slot, outcome, at in t.recent
        ]
        tasks.append(row)
    return {
        "ok": True, "scope": sid, "activeTasks": sum(not t.paused for t in live),
        "pausedTasks": sum(t.paused for t in live), "tasks": tasks,
    }  # fmt: skip
