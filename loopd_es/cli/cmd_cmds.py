"""``loopd-es cmd ...``: command sessions — start, list, show, read, write, signal, restart, watch, await, attach.

``cmd start`` prints the new command's id and returns at once; a detached owner process runs the command
in a PTY and records every transition on the log (see :mod:`loopd_es.procs.service`). Ids may be given as
any unique prefix of at least 4 characters.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from ..clock import stamped_builtins
from ..domain.command import CommandNotFoundError, CommandStateError, compile_read_pattern
from ..errors import UsageError
from ..events.command import WatchSpec
from ..ids import UnknownGoalError, check_id, resolve_goal_id
from ..log import open_store
from ..procs import awaits, owner_link, service
from ..procs.live import live_answer, with_live
from ..procs.outlog import read_pattern, read_plain
from ..procs.paths import CommandPaths
from ..procs.restart import restart_command
from ..text_safe import term_block, term_line
from .main import store_url
from .options import non_negative_number, positive_number

if TYPE_CHECKING:
    from ..log.base import LogStore

DETACH_KEY = b"\x1d"  # Ctrl-]


def register(subparsers: Any) -> None:
    """Add the ``cmd`` group to the top-level parser."""
    cmd = subparsers.add_parser(
        "cmd",
        help="command sessions: long-running processes in a PTY",
        description="Start a command in a pseudo-terminal and come back to it: read and search its output, "
        "write to it, signal it, wait for a pattern or its exit. Its lifecycle is on the log; its output in a "
        "file beside it.",
    )
    sub = cmd.add_subparsers(dest="cmd_command", metavar="ACTION", required=True)

    p = sub.add_parser("start", help="start COMMAND in a PTY; prints its id and returns at once")
    p.add_argument("--title", help="a name for the command (default: the command line)")
    p.add_argument("--cwd", help="working directory (default: the current one)")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="K=V",
        help="set an environment variable (only the key is recorded)",
    )
    p.add_argument("--timeout", type=int, metavar="S", help="terminate after S seconds (end reason timeout)")
    p.add_argument("--shell", action="store_true", help="run through /bin/sh -c with every word quoted")
    p.add_argument("--watch-filter", metavar="RE", help="push output lines matching RE (coalesced every 2 s)")
    p.add_argument("--watch-until", metavar="RE", help="the first line matching RE ends the watch")
    p.add_argument("--watch-ignore-case", action="store_true")
    p.add_argument(
        "--until-action",
        choices=("stop", "keep"),
        default="stop",
        help="on the until line: stop the command (default) or keep it running",
    )
    p.add_argument(
        "--goal", help="the goal this command belongs to (a display link): its id or a unique prefix"
    )
    p.add_argument("--cols", type=int, default=80)
    p.add_argument("--rows", type=int, default=24)
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND ARGS")
    p.set_defaults(handler=_start)

    p = sub.add_parser("list", help="every command: id, status, end reason, title")
    p.add_argument("--json", action="store_true", help='print one JSON object: {"commands": [...]}')
    p.set_defaults(handler=_list)

    p = sub.add_parser("show", help="one command's full record as JSON")
    p.add_argument("id")
    p.set_defaults(handler=_show)

    p = sub.add_parser(
        "read", help="print retained output (the last 512 KiB): a byte range or matching lines"
    )
    p.add_argument("id")
    p.add_argument(
        "--offset",
        type=non_negative_number,
        help="bytes to skip (with --pattern: matches to skip); default: the tail",
    )
    p.add_argument(
        "--limit",
        type=positive_number,
        help="bytes (default 64 KiB, max 256 KiB); with --pattern: matches (≤500)",
    )
    p.add_argument("--pattern", metavar="RE", help="only lines whose ANSI-stripped text matches RE")
    p.add_argument("--ignore-case", action="store_true")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=_read)

    p = sub.add_parser("write", help="type TEXT into the command's terminal (a newline is added)")
    p.add_argument("id")
    p.add_argument("text", nargs="+")
    p.add_argument("-n", "--no-newline", action="store_true")
    p.set_defaults(handler=_write)

    for name, text in (
        ("interrupt", "send SIGINT (the command may trap it)"),
        ("kill", "send SIGKILL at once"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("id")
        p.set_defaults(handler=_signal, op=name)
    p = sub.add_parser("terminate", help="SIGTERM, 3 s grace, then SIGKILL")
    p.add_argument("id")
    p.add_argument("--remove", action="store_true", help="also remove the record and its output")
    p.set_defaults(handler=_signal, op="terminate")

    p = sub.add_parser("resize", help="set the terminal size")
    p.add_argument("id")
    p.add_argument("cols", type=int)
    p.add_argument("rows", type=int)
    p.set_defaults(handler=_resize)

    p = sub.add_parser(
        "restart",
        help="stop the command if it runs and start it again as a new command (prints the new id; env values "
        "were never recorded, so they are not restored)",
    )
    p.add_argument("id")
    p.set_defaults(handler=_restart)

    p = sub.add_parser("remove", help="remove a finished command and its output (refused while running)")
    p.add_argument("id")
    p.set_defaults(handler=_remove)

    p = sub.add_parser(
        "watch",
        help="set or replace (counters reset) the watch of a running command; only --clear clears it",
    )
    p.add_argument("id")
    p.add_argument("--filter", metavar="RE")
    p.add_argument("--until", metavar="RE")
    p.add_argument("--ignore-case", action="store_true")
    p.add_argument("--until-action", choices=("stop", "keep"), default="stop")
    p.add_argument("--clear", action="store_true")
    p.set_defaults(handler=_watch)

    p = sub.add_parser("await", help="make GOAL wait for the command's exit (or a line matching --until)")
    p.add_argument("id")
    p.add_argument("--goal", required=True, help="the goal to wake: its id or a unique prefix of it")
    p.add_argument("--until", metavar="RE")
    p.add_argument("--ignore-case", action="store_true")
    p.set_defaults(handler=_await)

    p = sub.add_parser("attach", help="stream live output and forward typed input; Ctrl-] detaches")
    p.add_argument("id")
    p.set_defaults(handler=_attach)

    p = sub.add_parser("reconcile", help="mark commands whose owner is gone as missing")
    p.set_defaults(handler=_reconcile)


def _parse_env(items: list[str]) -> dict[str, str]:
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--env {item!r}: use KEY=VALUE")
        env[key] = value
    return env


async def _start(args: argparse.Namespace) -> int:
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if args.goal is not None:
        check_id("goal", args.goal)
    if (
        not argv or not argv[0].strip()
    ):  # `cmd start -- ''` said "title is required" (the default title is blank)
        raise UsageError("cmd start: command is required (give it after --, e.g. `cmd start -- make test`)")
    for flag, given in (
        ("--title", args.title),
        ("--watch-filter", args.watch_filter),
        ("--watch-until", args.watch_until),
    ):
        if given is not None and not given.strip():
            raise UsageError(f"cmd start: {flag} must not be empty (leave it out for the default)")
    watch = WatchSpec(
        filter=args.watch_filter or "",
        until=args.watch_until or "",
        ignore_case=args.watch_ignore_case,
        until_action=args.until_action,
    )
    spec = service.StartSpec(
        title=args.title or " ".join(argv),
        command=argv[0],
        args=argv[1:],
        cwd=args.cwd,
        env=_parse_env(args.env),
        timeout_seconds=args.timeout,
        shell=args.shell,
        watch=watch,
        goal_id=args.goal,
        cols=args.cols,
        rows=args.rows,
    )
    url = store_url(args)
    async with await open_store(url) as store:
        if args.goal is not None:
            spec.goal_id, _ = await _goal_named(store, args.goal)  # an id or a unique prefix, as for await
        command_id, _ = await service.start_command(store, url, spec)
    print(command_id)
    return 0


async def _list(args: argparse.Namespace) -> int:
    url = store_url(args)
    async with await open_store(url, create=False) as store:  # a query: a mistyped --store makes no log
        states = await service.list_states(store)
    states = [s for s in states if not s.removed]
    paths = CommandPaths(url)
    if args.json:
        print(json.dumps({"commands": [_record(s, paths) for s in states]}, indent=2))
        return 0
    for s in states:
        where = "" if not s.running or paths.runs_here(s.machine) else f"  (on machine {s.machine})"
        print(
            f"{s.id[:8]}  {s.status:<10}  {s.end_reason or '-':<9}  {s.exit_code if s.exit_code is not None else '-':>4}"
            f"  {term_line(s.title)}{where}"
        )
    return 0


def _record(s: Any, paths: CommandPaths) -> dict[str, Any]:
    out: dict[str, Any] = stamped_builtins(s)
    out["awaits"] = [stamped_builtins(a) for a in s.awaits]
    out["runs_here"] = paths.runs_here(s.machine)  # another machine's command: only it can judge the owner
    return out


async def _goal_named(store: LogStore, text: str) -> tuple[str, str]:
    """The goal ``text`` names (its id or a unique prefix, as every goal command takes) and its name.

    :raises UsageError: when no goal or several goals match, or the goal was cleared.
    """
    from ..domain.evolve import fold, initial
    from ..domain.streams import GOAL_PREFIX, goal_stream

    check_id("goal", text)
    ids = [s[len(GOAL_PREFIX) :] for s in await store.streams() if s.startswith(GOAL_PREFIX)]
    try:
        goal_id = resolve_goal_id(text, ids)
    except UnknownGoalError as e:
        if e.matches:
            raise
        goal_id = ""
    goal = (
        fold([e async for e in store.read_stream(goal_stream(goal_id))], initial(goal_id))
        if goal_id
        else None
    )
    if goal is None or not goal.exists:
        raise UsageError(
            f"Goal not found: {text!r} is no goal of this log (`loopd-es goals --all` lists them, with ids)"
        )
    return goal_id, goal.name


async def _with_command(args: argparse.Namespace) -> tuple[str, LogStore, CommandPaths, str]:
    check_id("command", args.id)  # before the store is opened: a bad id touches nothing
    url = store_url(args)
    store = await open_store(url, create=False)  # no log holds no command
    try:
        return url, store, CommandPaths(url), await service.resolve_id(store, args.id)
    except BaseException:
        await store.aclose()
        raise


async def _show(args: argparse.Namespace) -> int:
    _, store, paths, cid = await _with_command(args)
    async with store:
        state = await service.load_state(store, cid)
        if state is None or state.removed:
            raise CommandNotFoundError()
        live = await live_answer(paths, state)
        record = _record(with_live(state, live), paths)  # the counts that change with each chunk, as they are
        if live is not None:
            answer = msgspec.to_builtins(live)
            record["live"] = {k: v for k, v in answer.items() if k not in ("ok", "message")}
    print(json.dumps(record, indent=2))
    return 0


async def _read(args: argparse.Namespace) -> int:
    _, store, paths, cid = await _with_command(args)
    async with store:
        state = await service.load_state(store, cid)
    if state is None or state.removed:
        raise CommandNotFoundError("Command not found for this session.")
    if args.pattern is not None:
        pattern = compile_read_pattern(args.pattern, args.ignore_case)
        result = await anyio.to_thread.run_sync(
            read_pattern, paths.log(cid), pattern, args.offset, args.limit
        )
    else:
        result = await anyio.to_thread.run_sync(read_plain, paths.log(cid), args.offset, args.limit)
    if args.json:
        print(json.dumps({**msgspec.to_builtins(result), "live": state.running}))
    else:
        text = term_block(result.text)  # a program's output: colours dropped, other escapes shown, not run
        sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")
    return 0


async def _request(args: argparse.Namespace, request: owner_link.OwnerRequest) -> int:
    _, store, paths, cid = await _with_command(args)
    async with store:
        print(term_line(await service.command_request(store, paths, cid, request)))
    return 0


async def _write(args: argparse.Namespace) -> int:
    text = " ".join(args.text) + ("" if args.no_newline else "\n")
    return await _request(args, owner_link.Write(data=base64.b64encode(text.encode()).decode()))


async def _signal(args: argparse.Namespace) -> int:
    remove = bool(getattr(args, "remove", False))
    request: owner_link.OwnerRequest = (
        owner_link.Interrupt()
        if args.op == "interrupt"
        else owner_link.Kill(remove=remove)
        if args.op == "kill"
        else owner_link.Terminate(remove=remove)
    )
    return await _request(args, request)


async def _resize(args: argparse.Namespace) -> int:
    return await _request(args, owner_link.Resize(cols=args.cols, rows=args.rows))


async def _watch(args: argparse.Namespace) -> int:
    # as the tool (docs/reference/loopd.md#s3-17): the regexes are checked first, --clear too; only --clear
    # clears, and no --filter and no --until sets a watch that watches nothing
    return await _request(
        args,
        owner_link.Watch(
            filter=args.filter or "",
            until=args.until or "",
            clear=args.clear,
            ignore_case=args.ignore_case,
            until_action=args.until_action,
        ),
    )


async def _restart(args: argparse.Namespace) -> int:
    """The new id on stdout (as ``cmd start``), the reference's message on stderr."""
    url, store, _, cid = await _with_command(args)
    async with store:
        new_id, message = await restart_command(store, url, cid)
    print(new_id)
    print(term_line(message), file=sys.stderr)
    return 0


async def _remove(args: argparse.Namespace) -> int:
    _, store, paths, cid = await _with_command(args)
    async with store:
        print(term_line(await service.remove_command(store, paths, cid)))
    return 0


async def _await(args: argparse.Namespace) -> int:
    _, store, paths, cid = await _with_command(args)
    async with store:
        goal_id, name = await _goal_named(store, args.goal)
        _, message = await awaits.request_await(
            store,
            paths,
            cid,
            goal_id=goal_id,
            until=args.until,
            ignore_case=args.ignore_case,
            goal_name=name,  # the reference's messages name the goal by its name (docs/reference/loopd.md#s3-18)
        )
    print(term_block(message))
    return 0


async def _reconcile(args: argparse.Namespace) -> int:
    url = store_url(args)
    async with await open_store(url, create=False) as store:
        marked = await service.reconcile(store, CommandPaths(url))
    print(f"marked {marked} command(s) missing")
    return 0


async def _attach(args: argparse.Namespace) -> int:
    _, store, paths, cid = await _with_command(args)
    async with store:
        state = await service.load_state(store, cid)
    if state is None or not state.running:
        raise CommandStateError(f"Command is {state.status if state else 'gone'}; nothing to attach to.")
    try:
        stream = await owner_link.connect_owner(paths.socket(cid))
    except OSError:
        raise CommandStateError("No live handle (host restarted?); nothing to attach to.") from None
    from anyio.streams.buffered import BufferedByteReceiveStream

    async with stream:
        await stream.send(b'{"op": "attach"}\n')
        buffered = BufferedByteReceiveStream(stream)
        json.loads(await buffered.receive_until(b"\n", 1 << 16))
        print(f'[attached to "{term_line(state.title)}"; Ctrl-] detaches]', file=sys.stderr)
        with _raw_stdin():
            async with anyio.create_task_group() as tg:

                async def output() -> None:
                    out = sys.stdout.buffer
                    try:
                        while True:
                            out.write(await buffered.receive())
                            out.flush()
                    except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                        pass
                    tg.cancel_scope.cancel()

                tg.start_soon(output)
                fd = sys.stdin.fileno()
                pollable = _pollable(fd)
                while True:
                    if pollable:  # a file or /dev/null cannot be polled (EPERM); a read never blocks on it
                        await anyio.wait_readable(fd)
                    data = os.read(fd, 4096)
                    if not data or DETACH_KEY in data:
                        data = data.split(DETACH_KEY, 1)[0]
                        if data:
                            await stream.send(data)
                        break
                    await stream.send(data)
                tg.cancel_scope.cancel()
    print("\r\n[detached]", file=sys.stderr)
    return 0


def _pollable(fd: int) -> bool:
    """Whether ``fd`` can be waited on (a terminal, a pipe, a socket): epoll refuses regular files and
    ``/dev/null``, which ``cmd attach < FILE`` gives it; reading those never blocks anyway."""
    import stat

    mode = os.fstat(fd).st_mode
    return not (stat.S_ISREG(mode) or (stat.S_ISCHR(mode) and not os.isatty(fd)))


class _raw_stdin:
    """Put a terminal stdin into raw mode (keys go through unchanged, Ctrl-C included) and restore it."""

    def __enter__(self) -> None:
        import termios
        import tty

        self._saved: list[Any] | None = None
        if sys.stdin.isatty():
            self._saved = termios.tcgetattr(sys.stdin.fileno())
            tty.setraw(sys.stdin.fileno())

    def __exit__(self, *exc: object) -> None:
        import termios

        if self._saved is not None:
            termios.tcsetattr(sys.stdin.fileno(), termios.TCSADRAIN, self._saved)
