"""The command tools inside OpenCode (``loopd_command_*``, docs/reference/loopd.md#s3-17, #s3-18): an owner's
commands.

An OpenCode session starts a real process in a real PTY through the same service ``loopd-es cmd`` uses (a
detached supervisor per command, every transition on the log), and the command records that session as its
owner. Every other tool acts only on commands the calling session owns: another session's command is reported
as not found, in the reference's words. Validation happens before anything is spawned or recorded.

``kill`` and ``restart`` stay with the CLI and the dashboard, as in the reference (no agent tool there).
"""

from __future__ import annotations

import base64
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

import anyio.to_thread
import msgspec

from ..domain.command import (
    CommandNotFoundError,
    CommandState,
    CommandStateError,
    compile_read_pattern,
    validate_watch,
)
from ..errors import UsageError
from ..events.command import AwaitFired, WatchSpec
from ..ids import check_id, is_valid_id
from ..procs import owner_link, service
from ..procs.outlog import read_pattern, read_plain
from ..procs.paths import CommandPaths
from . import command_args as a
from .tool_spec import ToolSpec

if TYPE_CHECKING:
    from ..domain.state import GoalState
    from ..log.base import LogStore

NO_SESSION: Final = (
    "No session context available. Arbitrary commands require an owning session and are never auto-allowed."
)
NOT_FOUND: Final = "Command not found."
NOT_FOUND_READ: Final = "Command not found for this session."

COMMAND_TOOLS: Final = (
    ToolSpec(
        "loopd_command_start",
        "owner",
        "PREFER THIS over the built-in shell/bash tool whenever a command might take a while or never "
        "return: installs, builds, test suites, downloads, migrations, dev servers, watchers, log tails, "
        "REPLs, or anything interactive. The built-in shell BLOCKS your whole turn until the process "
        "exits; this returns immediately with a command_id. Only use the built-in shell for quick "
        "one-shots that finish in seconds. Start a standalone interactive OS process in the background, in "
        "a PTY. This is a raw process, NOT an AI worker: no agent, no checks, no turn loop. For multi-turn "
        "autonomous AI work with completion criteria, use loopd_create_goal instead. Returns a command_id "
        "for loopd_command_get (read output)/loopd_command_write (send stdin)/loopd_command_interrupt "
        "(Ctrl+C)/loopd_command_terminate (kill)/loopd_command_remove (delete). The user can open it live "
        "with `loopd-es cmd attach <id>`. Independent from goals: an optional goal_id is display-only "
        "metadata and never couples lifecycles. To make a specific goal wake up when this command "
        "finishes, call loopd_command_await separately after starting it. Never poll loopd_command_get in "
        "a loop: where a LINE appearing matters (dev-server READY), pass watch_until (+ watch_filter to "
        "cut noise); stop (default) ends the command at that line, keep lets it run on.",
        a.StartArgs,
        asks="bash",
    ),
    ToolSpec(
        "loopd_command_get",
        "owner",
        "Read a command's state and retained output (the last 512 KiB): a byte range (default the last "
        "64 KiB, at most 256 KiB), or with pattern the lines whose ANSI-stripped text matches (offset_bytes = "
        "matches to "
        "skip, limit_bytes = matches to return, at most 500).",
        a.GetArgs,
    ),
    ToolSpec(
        "loopd_command_write",
        "owner",
        "Write input to a running command's terminal (include \\n to press Enter).",
        a.WriteArgs,
    ),
    ToolSpec(
        "loopd_command_interrupt",
        "owner",
        "Send Ctrl+C (SIGINT) to a running command; it may trap it and go on.",
        a.CommandArgs,
    ),
    ToolSpec(
        "loopd_command_terminate",
        "owner",
        "Terminate a running command (SIGTERM, 3 s grace, then SIGKILL); remove:true also removes it.",
        a.TerminateArgs,
    ),
    ToolSpec(
        "loopd_command_remove",
        "owner",
        "Remove a finished command and its output (refused while it runs: terminate first).",
        a.CommandArgs,
    ),
    ToolSpec(
        "loopd_command_resize",
        "owner",
        "Resize a running command's terminal (applied live to the PTY winsize).",
        a.ResizeArgs,
    ),
    ToolSpec(
        "loopd_command_watch",
        "owner",
        "Set, replace (counters reset) or clear the watch of a running command: watch_filter records "
        "matching lines as watch pushes, watch_until ends the watch at its first match (and the command too "
        "with action "
        "stop).",
        a.WatchArgs,
    ),
    ToolSpec(
        "loopd_command_await",
        "owner",
        "Make one of your goals wake up once when one of your commands exits (or, with until, when a line "
        "matching it appears; the command keeps running). The evidence reaches the goal's worker as input.",
        a.AwaitArgs,
    ),
)
COMMAND_TOOL_NAMES: Final = frozenset(spec.name for spec in COMMAND_TOOLS)

LoadGoal = Callable[[str], Awaitable["GoalState"]]


class CommandTools:
    """Runs the ``loopd_command_*`` tools for one calling session over the procs service.

    Refusals raise :class:`~loopd_es.errors.LoopdError` subclasses carrying the reference's message; the
    dispatcher turns them into ``{"ok": false, "message": ...}``.
    """

    def __init__(self, store: LogStore, store_url: str | None, directory: str, load_goal: LoadGoal) -> None:
        self.store = store
        self.store_url = store_url
        self.directory = directory
        self.load_goal = load_goal

    @property
    def url(self) -> str:
        if self.store_url is None:
            raise UsageError(
                "command sessions need the engine's store URL (this engine was started without one)"
            )
        return self.store_url

    @property
    def paths(self) -> CommandPaths:
        return CommandPaths(self.url)

    async def call(
        self, tool: str, session: str, args: dict[str, Any], context: dict[str, Any]
    ) -> dict[str, Any]:
        handler: Callable[[str, dict[str, Any], dict[str, Any]], Awaitable[dict[str, Any]]]
        handler = getattr(self, "_" + tool.removeprefix("loopd_command_"))
        return await handler(session, args, context)

    # -- lookup ---------------------------------------------------------------------------------------

    async def _find(self, session: str, args: dict[str, Any], missing: str) -> CommandState:
        """The command named by ``command_id`` (an id, or a unique prefix among the session's own commands).

        :raises CommandNotFoundError: with ``missing`` when there is none, it was removed, or is not owned here.
        """
        text = args.get("command_id")
        if not is_valid_id(text):
            raise CommandNotFoundError(missing)
        assert isinstance(text, str)
        state = await service.load_state(self.store, text)
        if state is None and len(text) >= 4:
            hits = [
                s
                for s in await service.list_states(self.store)
                if s.id.startswith(text) and s.owner_session_id == session and not s.removed
            ]
            state = hits[0] if len(hits) == 1 else None
        if state is None or state.removed:
            raise CommandNotFoundError(missing)
        return state

    async def _owned(self, session: str, args: dict[str, Any], missing: str = NOT_FOUND) -> CommandState:
        state = await self._find(session, args, missing)
        if state.owner_session_id != session:
            raise CommandNotFoundError(missing)  # another session's command does not exist for this one
        return state

    async def _request(self, state: CommandState, request: owner_link.OwnerRequest) -> str:
        return await service.command_request(self.store, self.paths, state.id, request)

    # -- the tools -----------------------------------------------------------------------------------

    async def _start(self, session: str, args: dict[str, Any], context: dict[str, Any]) -> dict[str, Any]:
        action = args.get("watch_until_action")
        if action is not None and action not in ("stop", "keep"):
            raise UsageError(f'Invalid watch_until_action \'{action}\': must be "stop" or "keep".')
        argv = list(args.get("args") or ())  # the types were checked against a.StartArgs
        env: dict[str, str] = args.get("env") or {}
        cols, rows = args.get("cols", 80), args.get("rows", 24)
        if not _positive_int(cols) or not _positive_int(rows):
            raise UsageError(f"Invalid size {cols}x{rows}: cols and rows must be positive integers.")
        goal_id = args.get("goal_id") or None
        if goal_id is not None:
            check_id("goal", goal_id)
        timeout = args.get("timeout_seconds")
        if isinstance(timeout, float) and timeout.is_integer():
            timeout = int(timeout)  # JSON has one number type: 5.0 is the integer 5, as in JavaScript
        base = str(context.get("directory") or self.directory)
        cwd = os.path.join(base, str(args["cwd"])) if args.get("cwd") else base
        notify = args.get("notify_on_exit")
        spec = service.StartSpec(
            title=str(args.get("title") or ""),
            command=str(args.get("command") or ""),
            args=argv,
            cwd=cwd,
            env=dict(env),
            timeout_seconds=timeout,
            shell=bool(args.get("shell")),
            watch=WatchSpec(
                filter=str(args.get("watch_filter") or ""),
                until=str(args.get("watch_until") or ""),
                ignore_case=bool(args.get("watch_ignore_case")),
                until_action="keep" if action == "keep" else "stop",
            ),
            goal_id=goal_id,
            cols=int(cols),
            rows=int(rows),
            notify_on_exit=None if notify is None else bool(notify),
            owner_session_id=session,
        )
        command_id, _ = await service.start_command(self.store, self.url, spec)
        state = await service.load_state(self.store, command_id)
        assert state is not None
        return {
            "ok": True,
            "message": (
                f'Command "{state.title}" started as {command_id[:8]}... (read it with loopd_command_get).'
            ),
            "command_id": command_id,
            "command": _record(state),
        }

    async def _get(self, session: str, args: dict[str, Any], context: dict[str, Any]) -> dict[str, Any]:
        state = await self._owned(session, args, NOT_FOUND_READ)
        offset, limit = _count(args, "offset_bytes"), _count(args, "limit_bytes")
        pattern = args.get("pattern")
        log = self.paths.log(state.id)
        if pattern:
            compiled = compile_read_pattern(str(pattern), bool(args.get("ignore_case")))
            result = await anyio.to_thread.run_sync(read_pattern, log, compiled, offset, limit)
        else:
            result = await anyio.to_thread.run_sync(read_plain, log, offset, limit)
        out: dict[str, Any] = {
            "ok": True,
            "command_id": state.id,
            "live": state.running,
            "command": _record(state),
            "output": result.text,
            "offset": result.offset,
            "next_offset": result.next_offset,
            "retained": result.retained,
        }
        if result.total_matches is not None:
            out["totalMatches"] = result.total_matches
        return out

    async def _write(self, session: str, args: dict[str, Any], context: dict[str, Any]) -> dict[str, Any]:
        state = await self._owned(session, args)
        data: str = args["input"]
        message = await self._request(state, owner_link.Write(data=base64.b64encode(data.encode()).decode()))
        return {"ok": True, "message": message}

    async def _interrupt(self, session: str, args: dict[str, Any], context: dict[str, Any]) -> dict[str, Any]:
        state = await self._owned(session, args)
        return {"ok": True, "message": await self._request(state, owner_link.Interrupt())}

    async def _terminate(self, session: str, args: dict[str, Any], context: dict[str, Any]) -> dict[str, Any]:
        state = await self._owned(session, args)
        remove = bool(args.get("remove"))
        message = await self._request(state, owner_link.Terminate(remove=remove))
        out: dict[str, Any] = {"ok": True, "message": message, "removed": remove}
        fresh = None if remove else await service.load_state(self.store, state.id)
        if fresh is not None:
            out["status"] = fresh.status
        return out

    async def _remove(self, session: str, args: dict[str, Any], context: dict[str, Any]) -> dict[str, Any]:
        state = await self._owned(session, args)
        message = await service.remove_command(self.store, self.paths, state.id)
        return {"ok": True, "message": message, "removed": True}

    async def _resize(self, session: str, args: dict[str, Any], context: dict[str, Any]) -> dict[str, Any]:
        cols: Any = args.get("cols")
        rows: Any = args.get("rows")
        if not _positive_int(cols) or not _positive_int(rows):
            raise UsageError(f"Invalid size {cols}x{rows}: cols and rows must be positive integers.")
        state = await self._owned(session, args)
        message = await self._request(state, owner_link.Resize(cols=int(cols), rows=int(rows)))
        return {"ok": True, "message": message}

    async def _watch(self, session: str, args: dict[str, Any], context: dict[str, Any]) -> dict[str, Any]:
        state = await self._owned(session, args)
        if not state.running:
            raise CommandStateError(f"Command is {state.status}; watch is meaningless after exit.")
        if args.get("clear"):
            return {"ok": True, "message": await self._request(state, owner_link.Watch(clear=True))}
        spec = WatchSpec(
            filter=str(args.get("watch_filter") or ""),
            until=str(args.get("watch_until") or ""),
            ignore_case=bool(args.get("watch_ignore_case")),
            until_action=args.get("watch_until_action") or "stop",
        )
        validate_watch(spec)  # before the owner is asked: a bad watch leaves the previous one untouched
        request = owner_link.Watch(
            filter=spec.filter, until=spec.until, ignore_case=spec.ignore_case, until_action=spec.until_action
        )
        return {"ok": True, "message": await self._request(state, request)}

    async def _await(self, session: str, args: dict[str, Any], context: dict[str, Any]) -> dict[str, Any]:
        goal_id: Any = args.get("goal_id")
        goal = await self.load_goal(goal_id) if is_valid_id(goal_id) else None
        if goal is None or not goal.exists:
            raise UsageError("Goal not found.")
        state = await self._find(session, args, NOT_FOUND)
        if goal.owner_session_id != state.owner_session_id:
            raise UsageError("Owner mismatch: goal and command are owned by different sessions.")
        if goal.owner_session_id != session:
            raise UsageError("Owner mismatch: the await requester must own both the goal and the command.")
        until = args.get("until")
        events, message = await service.request_await(
            self.store,
            self.paths,
            state.id,
            goal_id=goal.goal_id,
            until=None if until is None else str(until),
            ignore_case=bool(args.get("ignore_case")),
            owner_session_id=session,
            goal_name=goal.name,
        )
        out: dict[str, Any] = {"ok": True, "message": message}
        if any(isinstance(e, AwaitFired) for e in events):
            out |= {"fired": True, "active": goal.status == "active"}
        return out


def _positive_int(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return value > 0 and float(value).is_integer()


def _count(args: dict[str, Any], name: str) -> int | None:
    value = args.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise UsageError(f"{name} must be a non-negative number")
    return int(value)


def _record(state: CommandState) -> dict[str, Any]:
    """What the model sees of a command: its record, without the awaits' internals and the fold's version."""
    out: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(state))  # JSON shapes: lists, not tuples
    for key in ("awaits", "version", "claim", "supervisor_pid", "removed"):
        out.pop(key, None)
    return {k: v for k, v in out.items() if v not in (None, "", [])}
