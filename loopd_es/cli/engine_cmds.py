"""Engine commands: ``run`` (the engine), ``notifications``, ``owner`` and ``worker`` operations, ``sim`` controls.

``loopd-es run`` stays in the foreground until Ctrl-C or SIGTERM (then it releases its lease and exits 0).
``owner`` and ``worker`` print the reference's message for each operation; a refused operation is one line on
stderr with exit 3. ``sim`` makes the simulated host's worker do what a real one does on its own (answer with
usage, go idle or busy, fail, open a tool call): the only way to poke a goal from outside now that the engine
notices idleness by itself.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sqlite3
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import msgspec

from ..errors import EXIT_CONFLICT, EXIT_OK, UsageError, first_failure
from ..host import host_url, open_host
from ..text_safe import term_block, term_line
from .main import store_url
from .options import MAX_DURATION_MS, add_host_option, non_negative_amount, non_negative_number
from .words import cli_words

if TYPE_CHECKING:
    import anyio
    from anyio.abc import TaskStatus

    from ..engine.daemon import RunOptions
    from ..engine.operations import Operations, Result
    from ..host.simulated import SimulatedHost


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``run``, ``notifications``, ``owner``, ``worker`` and ``sim`` to the ``loopd-es`` parser."""
    p = sub.add_parser(
        "run",
        help="run the engine: goals advance by themselves (one engine per log, others stand by; or --shared)",
        description="Run the engine in the foreground: it follows the log, reacts to the host's events, runs "
        "timers and maintenance, and delivers notifications. Stop it with Ctrl-C or SIGTERM.",
    )
    add_host_option(p)
    p.add_argument(
        "--holder",
        default=None,
        help="this engine's name in the lease (default: host:pid); a random suffix per start keeps two "
        "engines of one name apart",
    )
    p.add_argument(
        "--tool-api",
        type=Path,
        default=None,
        metavar="FILE",
        help="serve the OpenCode tools on the socket in FILE (default: .opencode/loopd/engine.json when it "
        "exists; written by `loopd-es opencode install`)",
    )
    p.add_argument(
        "--shared",
        action="store_true",
        help="run as one of many engines sharing this log's goals (each goal is claimed by one engine; a "
        "stopped or killed engine's goals are taken over once its membership runs out)",
    )
    p.add_argument("--lease-ms", type=int, default=15_000, help="lease length, >= 100 (default 15000)")
    p.add_argument(
        "--confirm-idle-ms", type=int, default=2000, help="idle confirmation period (default 2000)"
    )
    p.add_argument(
        "--maintenance-ms", type=int, default=30_000, help="maintenance interval, >= 100 (default 30000)"
    )
    p.add_argument(
        "--claim-ttl-ms",
        type=int,
        default=None,
        help="how long a /loop fire record holds between renewals (renewed while the fire lasts); past it "
        "another runner records the fire lost, >= 100 (default 60000)",
    )
    p.add_argument(
        "--idle-recover-ms",
        type=int,
        default=180_000,
        help="how long a running turn may sit on an idle worker before it is recovered (default 180000)",
    )
    p.set_defaults(handler=_run)

    p = sub.add_parser(
        "notifications",
        help="owner notifications and whether they were delivered",
        description="List the notifications the engine sent a goal's owner (blocked, completed, budget "
        "stops, ...) from the read models, each with when it was delivered or that it is still pending.",
    )
    p.add_argument("--goal", default=None, help="only this goal's (id or unique prefix)")
    p.add_argument("--json", action="store_true", help='one JSON document: {"notifications": [...]}')
    p.add_argument("--read-db", type=Path, default=None, metavar="PATH", help="the read database")
    p.add_argument("--no-catch-up", action="store_true", help="answer from the read models as they are")
    p.set_defaults(handler=_notifications)

    owner = sub.add_parser(
        "owner",
        help="owner operations: nudge, send, force-complete, force-block, abort",
        description="Act on a goal as its owner: the same operations as the owner's tools in OpenCode, "
        "recorded as events and carried out on the worker host.",
    )
    verbs = owner.add_subparsers(dest="verb", required=True, metavar="ACTION")
    for name, help_ in (
        ("nudge", "re-prompt the worker with the full steering (even if it is busy)"),
        ("send", "send the worker your words as a turn of their own (queued if the goal is not active)"),
        ("force-complete", "mark the goal complete without running its checks"),
        ("force-block", "block the goal"),
        ("abort", "abort the worker's run; status and session are kept"),
    ):
        v = verbs.add_parser(name, help=help_)
        v.add_argument("goal")
        add_host_option(v)
        if name == "send":
            v.add_argument("text")
        if name == "force-complete":
            v.add_argument("--summary")
            v.add_argument("--evidence")
        if name == "force-block":
            v.add_argument("--reason")
            v.add_argument("--needed")
        v.set_defaults(handler=_owner)

    worker = sub.add_parser(
        "worker",
        help="worker tools: get, progress, complete (runs the checks), block",
        description="Call the worker's tools from a shell, as the worker session named by --session: read "
        "its goal, report progress, claim completion (the goal's checks decide) or block the goal.",
    )
    verbs = worker.add_subparsers(dest="verb", required=True, metavar="ACTION")
    for name, help_ in (
        ("get", "the goal this worker session works on, as JSON"),
        ("progress", "report progress (resets the failure count)"),
        ("complete", "claim completion: the goal's checks run, and a failure is a rejection"),
        ("block", "block the goal: a real external blocker that needs the owner"),
    ):
        v = verbs.add_parser(name, help=help_)
        v.add_argument("--session", required=True, help="the worker session id")
        add_host_option(v)
        if name == "progress":
            v.add_argument("summary")
            v.add_argument("--next")
        if name == "complete":
            v.add_argument("summary")
            v.add_argument("evidence")
        if name == "block":
            v.add_argument("reason")
            v.add_argument("needed")
        v.set_defaults(handler=_worker)

    sim = sub.add_parser(
        "sim",
        help="make the simulated host's worker act (answer, idle, busy, fail, tool call)",
        description="Play the worker's part on the simulated host (sim:FILE): each action appends what a real "
        "host would report, so the engine reacts as it would to OpenCode.",
    )
    verbs = sim.add_subparsers(dest="verb", required=True, metavar="ACTION")
    for name, help_ in (
        ("reply", "answer the latest prompt with usage, then go idle"),
        ("idle", "report session.status idle and session.idle"),
        ("busy", "report busy until the next idle"),
        ("fail", "fail the run with an error as a host reports it"),
        ("tool", "open (or with --done close) a tool call"),
    ):
        v = verbs.add_parser(name, help=help_)
        v.add_argument(
            "session", metavar="SESSION|GOAL", help="a worker session id, or a goal id (or prefix)"
        )
        add_host_option(v)
        if name == "reply":
            v.add_argument("--input", type=non_negative_number, default=100, help="input tokens")
            v.add_argument("--output", type=non_negative_number, default=50, help="output tokens")
            v.add_argument("--cost", type=non_negative_amount, default=0.001, help="dollars")
            v.add_argument("--incomplete", action="store_true", help="the answer is still being written")
        if name == "fail":
            v.add_argument("--error", required=True, metavar="JSON", help="e.g. '{\"statusCode\": 429}'")
        if name == "tool":
            v.add_argument("call_id")
            v.add_argument("--done", action="store_true")
        v.set_defaults(handler=_sim)


# -- run ------------------------------------------------------------------------------------------------


async def _run(args: argparse.Namespace) -> int:
    import anyio

    from ..engine.core import EngineConfig
    from ..engine.daemon import RunOptions, check_tool_channel

    for name, least in _DURATION_BOUNDS.items():
        value = getattr(args, name)
        if value is not None and not least <= value <= MAX_DURATION_MS:
            raise UsageError(
                f"--{name.replace('_', '-')} must be from {least} to {MAX_DURATION_MS}, got {value}"
            )
    options = RunOptions(
        store_url=store_url(args),
        host_url=host_url(args.host),
        holder=f"{args.holder or f'{socket.gethostname()}:{os.getpid()}'}/{uuid.uuid4().hex[:8]}",
        config=EngineConfig(
            confirm_idle_ms=args.confirm_idle_ms,
            maintenance_ms=args.maintenance_ms,
            idle_recover_ms=args.idle_recover_ms,
        ),
        lease_ms=args.lease_ms,
        directory=os.getcwd(),
        tool_api=_tool_api(args.tool_api),
        shared=args.shared,
        claim_ttl_ms=args.claim_ttl_ms,
    )
    check_tool_channel(options)  # one line before anything starts (a task group would wrap it)
    await (await open_host(options.host_url)).aclose()  # a bad --host is said before a log is made for it
    stop = anyio.Event()

    def say(line: str) -> None:
        try:
            print(f"loopd-es run: {line}", file=sys.stderr, flush=True)
        except OSError:  # stderr on a full disk (or a closed pipe) must not stop the engine
            pass

    try:
        await _run_with_signals(options, stop, say)
    except BaseExceptionGroup as group:  # a failed start says what failed, in one line, with its exit code
        raise first_failure(group) from None
    say("stopped")
    return EXIT_OK


async def _run_with_signals(options: RunOptions, stop: anyio.Event, say: Callable[[str], None]) -> None:
    """The engine until ``stop`` is set, which SIGINT and SIGTERM do."""
    import anyio

    from ..engine.daemon import run_daemon

    async with anyio.create_task_group() as tg:

        async def on_signal(*, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                task_status.started()
                async for signum in signals:
                    say(f"{signal.Signals(signum).name}: stopping")
                    stop.set()
                    return

        # installed before anything is said: a SIGTERM right after "engine running" stops cleanly
        await tg.start(on_signal)
        await run_daemon(options, stop, say)
        tg.cancel_scope.cancel()


_DURATION_BOUNDS: Final = {
    "lease_ms": 100,
    "maintenance_ms": 100,
    "claim_ttl_ms": 100,
    "idle_recover_ms": 1,
    "confirm_idle_ms": 0,
}
"""The least each duration option takes: a zero lease or maintenance period would spin (and is no use)."""


def _tool_api(given: Path | None) -> Path | None:
    """The tool channel's config file: the one given (which must exist), or the installed one in this directory.

    It is read and its socket directory made ready here, so a stale or unsafe setup is one line before the
    engine takes the lease.
    """
    from ..engine.tool_api import CONFIG_NAME, ToolApiConfig
    from ..engine.tool_server import check_socket_path, private_socket_dir

    if given is not None and not given.is_file():
        raise UsageError(f"--tool-api {given}: no such file; run `loopd-es opencode install` first")
    default = Path(".opencode") / "loopd" / CONFIG_NAME
    path = given if given is not None else default if default.is_file() else None
    if path is not None:
        socket = Path(ToolApiConfig.load(path).socket)
        private_socket_dir(socket.parent)
        check_socket_path(socket)
    return path


# -- notifications --------------------------------------------------------------------------------------


async def _notifications(args: argparse.Namespace) -> int:
    from .read_models import read_models

    def query(conn: sqlite3.Connection) -> list[dict[str, Any]]:
        sql = "SELECT * FROM notifications"
        params: tuple[str, ...] = ()
        if args.goal is not None:
            sql += " WHERE goal_id LIKE ?"
            params = (args.goal.replace("%", "") + "%",)
        return [dict(row) for row in conn.execute(sql + " ORDER BY position", params)]

    rows = await read_models(args, query)
    if args.json:  # one document, as every query's --json (it was one object per line)
        sys.stdout.write(json.dumps({"notifications": rows}) + "\n")
        return EXIT_OK
    for row in rows:  # goal names and errors in the text come from outside: sanitised like every text view
        state = (
            f"delivered {row['delivered_at']}"
            if row["delivered_at"]
            else "here only (no session to show it in)"
            if row.get("undeliverable")
            else "pending"
        )
        head = term_line(f"{row['requested_at']}  {row['goal_id'][:8]}  {row['kind']:<11}  {state}")
        text = "".join(f"  {line}\n" for line in term_block(str(row["text"])).splitlines() or [""])
        sys.stdout.write(f"{head}\n{text}")
    if not rows:
        sys.stdout.write("no notifications\n")
    return EXIT_OK


# -- owner and worker -----------------------------------------------------------------------------------


@asynccontextmanager
async def _operations(args: argparse.Namespace) -> AsyncIterator[Operations]:
    from ..engine.operations import Operations
    from ..host.events import EngineHost
    from ..log import open_store

    async with await open_store(store_url(args), create=False) as store:  # no log holds a goal to act on
        host = await open_host(host_url(args.host))
        try:
            if not isinstance(host, EngineHost):
                raise UsageError(f"host {host.url} has no transcript or notices; use a sim: host")
            yield Operations(store, host, directory=os.getcwd())
        finally:
            await host.aclose()


def _print(result: Result) -> int:
    """The operation's message on stdout; one that did not do what was asked is one line on stderr, exit 3."""
    if result.data and result.status in (None, "none"):
        sys.stdout.write(msgspec.json.encode(result.data).decode() + "\n")
    message = cli_words(result.message)
    if not result.ok:
        sys.stderr.write(f"loopd-es: {term_line(message)}\n")
        return EXIT_CONFLICT
    sys.stdout.write(term_block(message) + "\n" if message else "")
    return EXIT_OK


async def _owner(args: argparse.Namespace) -> int:
    async with _operations(args) as ops:
        goal = await ops.service.resolve_id(args.goal)
        calls: dict[str, Callable[[], Awaitable[Result]]] = {
            "nudge": lambda: ops.nudge(goal),
            "send": lambda: ops.send(goal, args.text),
            "force-complete": lambda: ops.force_complete(goal, args.summary, args.evidence),
            "force-block": lambda: ops.force_block(goal, args.reason, args.needed),
            "abort": lambda: ops.abort_worker(goal),
        }
        return _print(await calls[args.verb]())


async def _worker(args: argparse.Namespace) -> int:
    async with _operations(args) as ops:
        s = args.session
        if args.verb == "get":
            result = await ops.get_goal(s)
            sys.stdout.write(
                msgspec.json.encode(result.data or {"status": "none", "message": result.message}).decode()
                + "\n"
            )
            return EXIT_OK
        if args.verb == "progress":
            return _print(await ops.report_progress(s, args.summary, args.next))
        if args.verb == "complete":
            result = await ops.complete(s, args.summary, args.evidence)
            if result.data.get("failed_checks"):
                sys.stdout.write(json.dumps(result.data["failed_checks"], indent=2) + "\n")
            sys.stdout.write(term_block(result.message) + "\n")  # a rejection is the worker's to act on
            return EXIT_OK
        return _print(await ops.block(s, args.reason, args.needed))


# -- sim ------------------------------------------------------------------------------------------------


async def _sim(args: argparse.Namespace) -> int:
    from ..host.simulated import SimulatedHost

    host = await open_host(host_url(args.host))
    try:
        if not isinstance(host, SimulatedHost):
            raise UsageError(f"`loopd-es sim` drives the simulated host only, not {host.url}")
        if args.session not in (await host.snapshot()).sessions:
            args.session = await _worker_of(args, args.session)
        await _sim_act(host, args)
    finally:
        await host.aclose()
    return EXIT_OK


async def _worker_of(args: argparse.Namespace, goal: str) -> str:
    """The worker session of the goal ``goal`` (id or unique prefix).

    :raises UsageError: when no session or goal matches, or the goal has no worker yet.
    """
    from ..app.service import GoalService
    from ..log import open_store

    async with await open_store(store_url(args), create=False) as store:
        service = GoalService(store, await open_host(host_url(args.host)))
        try:
            state = await service.load(await service.resolve_id(goal))
        finally:
            await service.host.aclose()
    if state.worker_session_id is None:
        raise UsageError(f"goal {state.goal_id} has no worker session yet")
    return state.worker_session_id


async def _sim_act(host: SimulatedHost, args: argparse.Namespace) -> None:
    s = args.session
    if args.verb == "reply":
        await host.reply(
            s, input=args.input, output=args.output, cost=args.cost, complete=not args.incomplete
        )
    elif args.verb == "idle":
        await host.go_idle(s)
    elif args.verb == "busy":
        await host.go_busy(s)
    elif args.verb == "fail":
        try:
            error = json.loads(args.error)
        except json.JSONDecodeError as e:
            raise UsageError(f"--error is not valid JSON ({e}); e.g. '{{\"statusCode\": 429}}'") from e
        if not isinstance(error, dict):
            raise UsageError("--error must be a JSON object, e.g. '{\"statusCode\": 429}'")
        await host.fail(s, error)
    else:
        await host.tool_call(s, args.call_id, done=args.done)
