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
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

import anyio.to_thread
import msgspec
from msgspec import UnsetType

from ..domain.command import (
    CommandNotFoundError,
    CommandState,
    CommandStateError,
    compile_read_pattern,
    validate_start,
    validate_watch,
)
from ..errors import UsageError
from ..events.base import Caller
from ..events.command import AwaitFired, UntilAction, WatchSpec
from ..ids import check_id, is_valid_id
from ..procs import awaits, owner_link, service
from ..procs.live import live_answer, with_live
from ..procs.outlog import read_pattern, read_plain
from ..procs.paths import CommandPaths
from . import command_args as a
from .command_record import reference_record
from .tool_spec import ToolArgs, ToolSpec

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
        nul_allowed=("input",),  # any byte goes to the terminal (the log records only how many)
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
        "Resize a command's terminal (applied live to a running command's PTY winsize; the size is stored "
        "either way).",
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

    Each handler takes its tool's validated Struct (:mod:`.command_args`), never the raw JSON: a value of the
    wrong type was refused before it got here, and what is left to check (a size that is not a whole number,
    an unknown watch action) is refused with the reference's words, never coerced. Refusals raise
    :class:`~loopd_es.errors.LoopdError` subclasses; the dispatcher turns them into ``{"ok": false, ...}``.
    Every change a tool makes records the calling tool call (``called_by``).
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

    async def call(self, tool: str, call: CommandCall, args: ToolArgs) -> dict[str, Any]:
        """The reply to ``tool`` called with ``args`` (already decoded by the tool's Struct)."""
        handler: Callable[[CommandCall, Any], Awaitable[dict[str, Any]]]
        handler = getattr(self, "_" + tool.removeprefix("loopd_command_"))
        return await handler(call, args)

    # -- lookup ---------------------------------------------------------------------------------------

    async def _find(self, session: str, text: str, missing: str) -> CommandState:
        """The command named by ``text`` (an id, or a unique prefix among the session's own commands).

        :raises CommandNotFoundError: with ``missing`` when there is none, it was removed, or is not owned here.
        """
        if not is_valid_id(text):
            raise CommandNotFoundError(missing)
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

    async def _owned(self, call: CommandCall, text: str, missing: str = NOT_FOUND) -> CommandState:
        state = await self._find(call.session, text, missing)
        if state.owner_session_id != call.session:
            raise CommandNotFoundError(missing)  # another session's command does not exist for this one
        return state

    async def _request(self, state: CommandState, request: owner_link.OwnerRequest) -> str:
        return await service.command_request(self.store, self.paths, state.id, request)

    # -- the tools -----------------------------------------------------------------------------------

    async def _start(self, call: CommandCall, args: a.StartArgs) -> dict[str, Any]:
        action = _given(args.watch_until_action)
        if action is not None and action not in ("stop", "keep"):
            raise UsageError(f'Invalid watch_until_action \'{action}\': must be "stop" or "keep".')
        watch = WatchSpec(
            filter=_given(args.watch_filter) or "",
            until=_given(args.watch_until) or "",
            ignore_case=_given(args.watch_ignore_case) or False,
            until_action="keep" if action == "keep" else "stop",
        )
        timeout = _timeout(_given(args.timeout_seconds))
        # the reference's order: title, command, owner, timeout, watch; then what it did not check
        validate_start(args.title, args.command, timeout, None if watch.empty else watch, call.session)
        cols, rows = _size(args.cols, args.rows)
        goal_id = _given(args.goal_id) or None
        if goal_id is not None:
            check_id("goal", goal_id)
        base = str(call.context.get("directory") or self.directory)
        cwd = _given(args.cwd)
        spec = service.StartSpec(
            title=args.title,
            command=args.command,
            args=_given(args.args) or (),
            cwd=os.path.join(base, cwd) if cwd else base,
            env=_given(args.env) or {},
            timeout_seconds=cast(int | None, timeout),  # checked just above
            shell=_given(args.shell) or False,
            watch=watch,
            goal_id=goal_id,
            cols=cols,
            rows=rows,
            notify_on_exit=_given(args.notify_on_exit),
            owner_session_id=call.session,
            called_by=call.caller,
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
            "command": reference_record(state),
        }

    async def _get(self, call: CommandCall, args: a.GetArgs) -> dict[str, Any]:
        state = await self._owned(call, args.command_id, NOT_FOUND_READ)
        offset, limit = _count(args.offset_bytes, "offset_bytes"), _count(args.limit_bytes, "limit_bytes")
        state = with_live(state, await live_answer(self.paths, state))  # counts that change with each chunk
        pattern = _given(args.pattern)
        log = self.paths.log(state.id)
        if pattern:
            compiled = compile_read_pattern(pattern, _given(args.ignore_case) or False)
            result = await anyio.to_thread.run_sync(read_pattern, log, compiled, offset, limit)
        else:
            result = await anyio.to_thread.run_sync(read_plain, log, offset, limit)
        out: dict[str, Any] = {
            "ok": True,
            "command_id": state.id,
            "live": state.running,
            "command": reference_record(state),
            "output": result.text,
            "offset": result.offset,
            "next_offset": result.next_offset,
            "retained": result.retained,
        }
        if result.total_matches is not None:
            out["totalMatches"] = result.total_matches
        return out

    async def _write(self, call: CommandCall, args: a.WriteArgs) -> dict[str, Any]:
        state = await self._owned(call, args.command_id)
        data = base64.b64encode(args.input.encode()).decode()
        message = await self._request(state, owner_link.Write(data=data, called_by=call.caller))
        return {"ok": True, "message": message}

    async def _interrupt(self, call: CommandCall, args: a.CommandArgs) -> dict[str, Any]:
        state = await self._owned(call, args.command_id)
        return {
            "ok": True,
            "message": await self._request(state, owner_link.Interrupt(called_by=call.caller)),
        }

    async def _terminate(self, call: CommandCall, args: a.TerminateArgs) -> dict[str, Any]:
        state = await self._owned(call, args.command_id)
        remove = _given(args.remove) or False
        message = await self._request(state, owner_link.Terminate(remove=remove, called_by=call.caller))
        out: dict[str, Any] = {"ok": True, "message": message, "removed": remove}
        fresh = None if remove else await service.load_state(self.store, state.id)
        if fresh is not None:
            out["status"] = fresh.status
        return out

    async def _remove(self, call: CommandCall, args: a.CommandArgs) -> dict[str, Any]:
        state = await self._owned(call, args.command_id)
        message = await service.remove_command(self.store, self.paths, state.id, called_by=call.caller)
        return {"ok": True, "message": message, "removed": True}

    async def _resize(self, call: CommandCall, args: a.ResizeArgs) -> dict[str, Any]:
        state = await self._owned(
            call, args.command_id
        )  # another session's command: not found, before the size
        cols, rows = _size(args.cols, args.rows)
        request = owner_link.Resize(cols=cols, rows=rows, called_by=call.caller)
        return {"ok": True, "message": await self._request(state, request)}

    async def _watch(self, call: CommandCall, args: a.WatchArgs) -> dict[str, Any]:
        state = await self._owned(call, args.command_id)
        if not state.running:
            raise CommandStateError(f"Command is {state.status}; watch is meaningless after exit.")
        spec = WatchSpec(
            filter=_given(args.watch_filter) or "",
            until=_given(args.watch_until) or "",
            ignore_case=_given(args.watch_ignore_case) or False,
            until_action=cast(UntilAction, _given(args.watch_until_action) or "stop"),  # checked just below
        )
        # before the owner is asked, a clear too (the reference's order): a bad watch leaves the previous one
        # untouched; only clear:true clears, anything else replaces the watch
        validate_watch(spec)
        request = owner_link.Watch(
            clear=_given(args.clear) or False,
            filter=spec.filter,
            until=spec.until,
            ignore_case=spec.ignore_case,
            until_action=spec.until_action,
            called_by=call.caller,
        )
        return {"ok": True, "message": await self._request(state, request)}

    async def _await(self, call: CommandCall, args: a.AwaitArgs) -> dict[str, Any]:
        goal = await self.load_goal(args.goal_id) if is_valid_id(args.goal_id) else None
        if goal is None or not goal.exists:
            raise UsageError("Goal not found.")
        state = await self._find(call.session, args.command_id, NOT_FOUND)
        if goal.owner_session_id != state.owner_session_id:
            raise UsageError("Owner mismatch: goal and command are owned by different sessions.")
        if goal.owner_session_id != call.session:
            raise UsageError("Owner mismatch: the await requester must own both the goal and the command.")
        events, message = await awaits.request_await(
            self.store,
            self.paths,
            state.id,
            goal_id=goal.goal_id,
            until=_given(args.until),
            ignore_case=_given(args.ignore_case) or False,
            owner_session_id=call.session,
            goal_name=goal.name,
            called_by=call.caller,
        )
        out: dict[str, Any] = {"ok": True, "message": message}
        if any(isinstance(e, AwaitFired) for e in events):
            out |= {"fired": True, "active": goal.status == "active"}
        return out


class CommandCall(msgspec.Struct, frozen=True, kw_only=True):
    """Who is calling a command tool: the session (the owner of what it touches), OpenCode's call context
    (the project directory) and the tool call recorded on what the call changes."""

    session: str
    context: dict[str, Any]
    caller: Caller | None = None


T = TypeVar("T")


def _given(value: T | UnsetType) -> T | None:
    """An optional argument's value, ``None`` when the call left it out."""
    return None if isinstance(value, UnsetType) else value


def _size(cols: float | UnsetType, rows: float | UnsetType) -> tuple[int, int]:
    """A terminal size as the reference takes it: positive whole numbers (``80.0`` is 80, ``80.5`` is refused);
    a size left out is the default 80x24."""
    wide = 80 if isinstance(cols, UnsetType) else cols
    high = 24 if isinstance(rows, UnsetType) else rows
    if not all(n > 0 and float(n).is_integer() for n in (wide, high)):
        raise UsageError(f"Invalid size {_num(wide)}x{_num(high)}: cols and rows must be positive integers.")
    return int(wide), int(high)


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _timeout(value: float | None) -> float | None:
    """``timeout_seconds`` as a whole number of seconds where it is one (JSON has one number type: 5.0 is 5, as
    in JavaScript); any other number is left for :func:`validate_start` to refuse in the reference's order."""
    if value is None or not float(value).is_integer():
        return value
    return int(value)


def _count(value: float | UnsetType, name: str) -> int | None:
    if isinstance(value, UnsetType):
        return None
    if value < 0 or not float(value).is_integer():
        raise UsageError(f"{name} must be a non-negative integer")
    return int(value)
