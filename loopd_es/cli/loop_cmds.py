"""``loopd-es loop ...`` (the ``/loop`` command, its scheduler, its history) and ``loopd-es loops`` (the read model).

``loop add 5m check the deploy`` and ``loop list|status|cancel ID|pause ID|resume ID|stop-all|help`` are the
reference's ``/loop`` with its messages word for word, scoped to ``--session`` (or ``$LOOPD_SESSION``).
``loop tick`` fires what is due once; ``loop run`` keeps firing (until ``--duration`` or SIGTERM);
any number of them may run against one log. ``❌`` results go to stderr with exit 2 (usage) or 3 (conflict).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sqlite3
import sys
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn, Protocol, TypeVar

import anyio
import anyio.to_thread

from ..clock import Clock, FakeClock, SystemClock, display, from_ms
from ..domain.loop import decide, grammar, jsclass, texts
from ..errors import LogNotFoundError, StorageError, UsageError
from ..host import host_url, open_host
from ..host.errors import HostError
from ..log import open_store
from ..sched import service, tools
from ..sched.runner import FireReport, Scheduler
from ..text_safe import json_safe, term_line, term_lines
from .options import add_host_option, epoch_ms, ms_at_least, positive_amount, store_url

SESSION_ENV = "LOOPD_SESSION"
log = logging.getLogger(__name__)
_LOOP_WORDS = {"list", "status", "cancel", "stop", "pause", "resume", "stop-all", "help", "--help", "-h"}


def register(subparsers: Any) -> None:
    """Add ``loop`` and ``loops`` to the top-level parser."""
    p = subparsers.add_parser(
        "loop",
        help="scheduled /loop tasks: add, list, cancel, pause, resume, stop-all, tick, run, history",
        description="The /loop command of opencode-plugin-loop on the log. ACTION is add [EVERY] [--once] "
        "[--jitter=true|false] [--] PROMPT, list, status, cancel ID, pause ID, resume ID, stop-all, help, "
        "tick, run, activate SESSION, session-deleted SESSION, lease OWNER, history ID, or tool JSON.",
    )
    _options(p)
    p.add_argument("words", nargs=argparse.REMAINDER, metavar="ACTION ...")
    p.set_defaults(handler=_loop)

    p = subparsers.add_parser(
        "loops",
        help="every /loop task: next due, last fire, missed slots, owner",
        description="List every scheduled /loop task from the read model: its schedule and status, when it "
        "is next due, its last fire and outcome, the slots it missed and the engine that owns it.",
    )
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--read-db", type=Path, default=None, metavar="PATH", help="the read database")
    p.add_argument("--no-catch-up", action="store_true", help="answer from the read model as it is")
    p.set_defaults(handler=_loops)


def _options(p: argparse.ArgumentParser) -> None:
    """The options of ``loop``; accepted before the action and, for the non-/loop actions, after it too."""
    p.add_argument("--session", default=None, help=f"the owner session (default: ${SESSION_ENV})")
    p.add_argument("--message-id", default=None, help="the originating message: the same id makes one task")
    p.add_argument(
        "--owner", default=None, help="the owner whose lease the task lives on (tasks), or runner name"
    )
    p.add_argument("--ephemeral", action="store_true", help="cancel the task when its owner's lease expires")
    p.add_argument(
        "--directory", type=Path, default=None, help="project directory for loop.md (default: cwd)"
    )
    p.add_argument(
        "--now", type=epoch_ms, default=None, metavar="MS", help="pretend the time is MS (epoch ms)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON document")
    add_host_option(p)
    p.add_argument("--claimer", default=None, help="tick/run: this scheduler's name (default: a fresh id)")
    p.add_argument(
        "--all-sessions", action="store_true", help="tick/run: fire every session, not only the active one"
    )
    p.add_argument(
        "--claim-ttl-ms",
        type=ms_at_least(100),
        default=60_000,
        help="tick/run: how long a fire record holds between renewals (past it, the fire is lost)",
    )
    p.add_argument(
        "--duration", type=positive_amount, default=None, metavar="S", help="run: stop after S seconds"
    )
    p.add_argument(
        "--period-ms", type=ms_at_least(1), default=500, help="run: the longest sleep between ticks"
    )
    p.add_argument(
        "--ttl-ms", type=ms_at_least(100), default=15_000, help="lease, run --owner: how long a lease lasts"
    )
    p.add_argument("--read-db", type=Path, default=None, help="history: the read database")
    p.add_argument("--no-catch-up", action="store_true", help=argparse.SUPPRESS)


class _Strict(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"loop: {message}; run `loopd-es loop --help`")


def _reparse(args: argparse.Namespace, words: list[str]) -> list[str]:
    """Options given after a non-/loop action (``loop tick --now MS``) land in ``args``; the rest is returned."""
    p = _Strict(prog="loopd-es loop", add_help=False)
    _options(p)
    p.add_argument("rest", nargs="*")
    defaults = {a.dest: a.default for a in p._actions}
    extra = p.parse_args(words)
    for k, v in vars(extra).items():
        if k != "rest" and v != defaults.get(k):
            setattr(args, k, v)
    return list(extra.rest)


def _clock(args: argparse.Namespace) -> Clock:
    return FakeClock(from_ms(args.now)) if args.now is not None else SystemClock()


async def _loop(args: argparse.Namespace) -> int:
    words: list[str] = list(args.words)
    if not words:
        raise UsageError(
            "loop: give an ACTION, e.g. `loopd-es loop add 5m check the deploy` (see `loop help`)"
        )
    verb = words[0]
    if verb == "add" or verb.lower() in _LOOP_WORDS:
        text = " ".join(words[1:] if verb == "add" else words)
        return await _command(args, text)
    words = [verb, *_reparse(args, words[1:])]
    if verb in ("tick", "run"):
        return await _run(args, forever=verb == "run")
    if verb == "history" and len(words) != 2:
        raise UsageError(
            "loop history: give one task id, e.g. `loopd-es loop history 3f2a` (`loop list` shows them)"
        )
    if verb == "history" and len(words) == 2:
        return await _history(args, words[1])
    if verb == "tool" and len(words) == 2:
        return await _tool(args, words[1])
    async with await open_store(store_url(args)) as store:
        now = _clock(args).now()
        if verb == "activate" and len(words) == 2:
            await service.activate(store, words[1], now)
        elif verb == "session-deleted" and len(words) == 2:
            n = await service.delete_session(store, words[1], now)
            print(f"cleaned {n} task(s) for deleted session")
        elif verb == "lease" and len(words) == 2:
            await service.renew_lease(store, words[1], now, args.ttl_ms)
        else:
            raise UsageError(f"loop: unknown action {' '.join(words)!r}; run `loopd-es loop help`")
    return 0


async def _command(args: argparse.Namespace, text: str) -> int:
    session = args.session if args.session is not None else os.environ.get(SESSION_ENV)
    now = _clock(args).now()
    if args.ephemeral and not args.owner:
        raise UsageError(
            "loop: --ephemeral needs --owner NAME, the lease the task lives on (see `loop lease`)"
        )
    parsed = grammar.parse(text, has_session=bool(session))
    try:  # only a task's creation (or a refused one) makes a log: list, cancel, ... have nothing to act on
        store = await open_store(store_url(args), create=not isinstance(parsed, grammar.Sub))
    except LogNotFoundError:
        if not (isinstance(parsed, grammar.Sub) and parsed.action == "help"):
            raise
        out = decide.Outcome(message=texts.HELP, model_prompt=texts.presentation_prompt(texts.HELP))
    else:
        async with store:
            if args.ephemeral and args.owner:
                await service.renew_lease(store, args.owner, now, args.ttl_ms)
            out = await service.handle(
                store, text, session_id=session, now=now, cfg=decide.Config(), origin_id=args.message_id,
                owner=args.owner, durable=not args.ephemeral, directory=args.directory,
            )  # fmt: skip
    if args.json:
        doc = {
            "ok": out.error is None,
            "message": out.message,
            "task_id": out.task_id,
            "model_prompt": out.model_prompt,
        }
        print(json_safe(json.dumps(doc, ensure_ascii=False)))
    elif out.error is None:
        print(term_lines(out.message))
    if out.error is not None:
        if not args.json:
            print(term_lines(out.message), file=sys.stderr)
        return 2 if out.error == "usage" else 3
    return 0


async def _run(args: argparse.Namespace, *, forever: bool) -> int:
    clock = _clock(args)
    claimer = args.claimer or f"loop-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    cfg = decide.Config(claim_ttl_ms=args.claim_ttl_ms)
    host = await open_host(host_url(args.host))
    totals = {"fired": 0, "failed": 0, "missed": 0, "swept": 0, "goal_ticks": 0}
    try:
        async with await open_store(store_url(args)) as store:
            sched = Scheduler(store, host, clock, claimer=claimer, cfg=cfg, all_sessions=args.all_sessions,
                              owner=args.owner, lease_ttl_ms=args.ttl_ms)  # fmt: skip
            if forever:
                await _forever(sched, clock, args, totals)
            else:
                _add(totals, await sched.fire_due())
    finally:
        await host.aclose()
    print(json.dumps({"claimer": claimer, **totals}))
    return 0


class _Ticker(Protocol):
    """What ``loop run`` drives: a :class:`~loopd_es.sched.runner.Scheduler`."""

    async def fire_due(self) -> FireReport: ...

    def next_wake(self) -> datetime | None: ...


def _add(totals: dict[str, int], r: FireReport) -> None:
    for k in totals:
        v = getattr(r, k)
        totals[k] += len(v) if isinstance(v, list) else v


async def _forever(sched: _Ticker, clock: Clock, args: argparse.Namespace, totals: dict[str, int]) -> None:
    """Fire, then sleep until the next due time (at most ``--period-ms``), until SIGTERM/SIGINT or ``--duration``."""
    deadline = None if args.duration is None else anyio.current_time() + args.duration
    stop = anyio.Event()
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:

        async def on_signal() -> None:
            async for _ in signals:
                stop.set()
                return

        async with anyio.create_task_group() as tg:
            tg.start_soon(on_signal)
            while not stop.is_set() and (deadline is None or anyio.current_time() < deadline):
                pause = args.period_ms / 1000
                try:
                    _add(totals, await sched.fire_due())
                except (StorageError, HostError) as e:  # transient: the next tick re-reads and decides again
                    log.warning("tick failed, retrying: %s", e)
                    wake = None  # after a full period: a failing store is not retried in a tight loop
                else:
                    wake = sched.next_wake()
                if wake is not None:
                    pause = min(pause, max(0.0, (wake - clock.now()).total_seconds()))
                with anyio.move_on_after(pause):
                    await stop.wait()
            tg.cancel_scope.cancel()


async def _tool(args: argparse.Namespace, raw: str) -> int:
    try:
        call = json.loads(raw)
    except json.JSONDecodeError as e:
        raise UsageError(
            f'loop tool: the argument is not JSON ({e}); e.g. \'{{"action": "list"}}\''
        ) from None
    if not isinstance(call, dict):
        raise UsageError('loop tool: give a JSON object, e.g. \'{"action": "list"}\'')
    call = tools.decode_call(call)
    session = args.session if args.session is not None else os.environ.get(SESSION_ENV)
    now = _clock(args).now()
    async with await open_store(store_url(args)) as store:
        if call.get("tool") == "loop_status":
            result = await tools.loop_status(store, session_id=session)
        else:
            result = await tools.loop_schedule(
                store, call, session_id=session, now=now, cfg=decide.Config(),
                origin_id=args.message_id or str(uuid.uuid4()), directory=str(args.directory or Path.cwd()),
            )  # fmt: skip
    print(json_safe(json.dumps(jsclass.js_numbers(result), indent=2, ensure_ascii=False)))
    return 0 if result.get("ok") else 3


T = TypeVar("T")


async def read_models(args: argparse.Namespace, query: Callable[[sqlite3.Connection], T]) -> T:
    """Catch the ``loops`` read model up (unless ``--no-catch-up``), then run ``query`` on the read database.

    Only ``loops`` is opened (found with the registry's ``projection_named``), so the other read models are
    neither imported nor caught up here.
    """
    import importlib

    from ..projector import Projection, Projector, default_read_db

    url = store_url(args)
    named = getattr(importlib.import_module("projections"), "projection_named", None)
    loops = named("loops") if callable(named) else None
    if not isinstance(loops, Projection):
        raise UsageError(
            "the loops read model is not in the projections registry; is loopd-es installed whole?"
        )
    read_db: Path = args.read_db or default_read_db(url)
    store = await open_store(url, create=False)
    try:
        async with await Projector.open(store, [loops], read_db) as projector:
            if not args.no_catch_up:
                await projector.run_once()
    finally:
        await store.aclose()

    def run() -> T:
        conn = sqlite3.connect(f"{read_db.absolute().as_uri()}?mode=ro", uri=True)
        try:
            conn.execute("BEGIN")  # one snapshot for every table the query reads
            return query(conn)
        finally:
            conn.close()

    return await anyio.to_thread.run_sync(run)


def _loop_rows(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    sql = (
        "SELECT task_id, session_id, mode, status, next_due_at, last_fired_at, fires, failures, missed, owner, "
        "durable, in_flight_slot, prompt FROM loops ORDER BY session_id, rowid"
    )
    try:
        cur = conn.execute(sql)
    except sqlite3.OperationalError:
        return []
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur]


def _ts(ms: int | None) -> str:
    if not ms:
        return "-"
    return display(from_ms(ms))


async def _loops(args: argparse.Namespace) -> int:
    rows = await read_models(args, _loop_rows)
    if args.json:
        print(json_safe(json.dumps({"loops": rows}, ensure_ascii=False)))
        return 0
    if not rows:
        print("no /loop tasks")
        return 0
    print(f"{'TASK':<9} {'SESSION':<10} {'MODE':<11} {'STATUS':<24} {'NEXT DUE':<19} {'LAST FIRE':<19} "
          f"{'FIRES':>5} {'MISSED':>6} OWNER")  # fmt: skip
    for r in rows:
        print(term_line(f"{r['task_id']:<9} {r['session_id'][:10]:<10} {r['mode']:<11} {r['status']:<24} "
              f"{_ts(r['next_due_at']):<19} {_ts(r['last_fired_at']):<19} {r['fires']:>5} {r['missed']:>6} "
              f"{r['owner'] or '-'}"))  # fmt: skip
    return 0


def _fire_line(f: dict[str, Any]) -> str:
    """One slot attempt, with the next due time it chose and why (the jitter offset or the fallback draw)."""
    line = f"slot {f['slot']} attempt {f['attempt']}: {f['outcome']}" + (
        f" ({f['reason']})" if f["reason"] else ""
    )
    line += f" by {f['fired_by']}"
    if f["next_due_at"]:
        why = (
            f"jitter {f['jitter_offset_ms']:+d} ms"
            if f["fallback_u"] is None
            else f"fallback u={f['fallback_u']}"
        )
        line += f"; next due {_ts(f['next_due_at'])} ({why})"
    return line


async def _history(args: argparse.Namespace, task_id: str) -> int:
    def query(conn: sqlite3.Connection) -> dict[str, Any]:
        task = [r for r in _loop_rows(conn) if r["task_id"] == task_id]
        if not task:
            return {}
        fires = conn.execute(
            "SELECT slot, attempt, due_at, claimed_at, fired_by, outcome, reason, ended_at, next_due_at, "
            "jitter_offset_ms, fallback_u FROM loop_fires "
            "WHERE task_id = ? ORDER BY slot, attempt", (task_id,),
        ).fetchall()  # fmt: skip
        missed = conn.execute(
            "SELECT first_slot, last_slot, n, at FROM loop_missed WHERE task_id = ? ORDER BY first_slot",
            (task_id,),
        ).fetchall()
        keys = ("slot", "attempt", "due_at", "claimed_at", "fired_by", "outcome", "reason", "ended_at", "next_due_at",
                "jitter_offset_ms", "fallback_u")  # fmt: skip
        return {
            "task": task[0],
            "fires": [dict(zip(keys, f, strict=True)) for f in fires],
            "missed": [dict(zip(("first_slot", "last_slot", "n", "at"), m, strict=True)) for m in missed],
        }

    doc = await read_models(args, query)
    if not doc:
        raise UsageError(f"loop history: no task {task_id!r}; `loopd-es loops` lists the tasks")
    if args.json:
        print(json_safe(json.dumps(doc, ensure_ascii=False)))
        return 0
    t = doc["task"]
    print(
        term_line(
            f"task {t['task_id']} ({t['mode']}, {t['status']}) in session {t['session_id']}: {t['prompt'][:60]}"
        )
    )
    events = [(f["claimed_at"] or 0, _fire_line(f)) for f in doc["fires"]]
    events += [
        (m["at"], f"slots {m['first_slot']}-{m['last_slot']}: missed ({m['n']})") for m in doc["missed"]
    ]
    for at, line in sorted(events):
        print(term_line(f"  {_ts(at)}  {line}"))
    return 0
