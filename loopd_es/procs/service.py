"""The application layer of command sessions: read state from the log, decide, append, reach the owner.

Owner design: ``start`` records ``command.started`` and launches a detached per-command supervisor
(``python -m loopd_es.procs.supervisor``) that owns the PTY, appends every later transition, and serves
requests (write, interrupt, terminate, kill, resize, watch, attach) on a Unix socket beside the log. The
owner's liveness is an ``flock`` it holds for life: the CLI takes it *before* recording the start and hands
the locked descriptor to the supervisor, so a command is never recorded running without a lock holder,
and a reconciler that can take the lock knows the owner is gone and marks the command ``missing``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import msgspec

from ..clock import EPOCH, WALL, parse_or_none
from ..domain.command import (
    TERMINATE_GRACE_S,
    CommandNotFoundError,
    CommandState,
    CommandStateError,
    deadline_for,
    decide_discard,
    decide_fire_outstanding,
    decide_missing,
    decide_remove,
    decide_resize,
    evolve,
    validate_process,
    validate_size,
    validate_start,
)
from ..domain.loop.jsclass import trim
from ..errors import ConflictError, LoopdError, StreamNotFoundError, UsageError, WrongExpectedVersionError
from ..events.base import Caller, Event
from ..events.catalogue import decode_payload
from ..events.command import STREAM_PREFIX, CommandStarted, WatchSpec, command_stream
from ..events.envelope import NO_STREAM, NewEvent
from ..ids import check_id, is_valid_id
from ..private_files import create_private
from .outlog import stored_facts
from .owner_link import (
    OWNER_CONNECT_WAIT_S,
    Kill,
    OwnerAnswer,
    OwnerRequest,
    Resize,
    Terminate,
    owner_request,
)
from .paths import CommandPaths, absolute_store_url, owner_alive, take_lock

if TYPE_CHECKING:
    from ..log.base import LogStore

DIRECT_TERMINATE = signal.SIGUSR1
"""Sent to the owner process when it does not answer a terminate: its handler signals the child itself."""
DIRECT_KILL = signal.SIGUSR2
"""Likewise for kill."""
ANSWER_WITHIN_S = {"terminate": TERMINATE_GRACE_S + 3.0, "kill": 3.0}
"""How long terminate and kill wait for the owner's answer before they signal through the owner directly."""


async def load_state(store: LogStore, command_id: str) -> CommandState | None:
    """Fold one command's stream (``None`` when there is no such command)."""
    state: CommandState | None = None
    last = ""
    try:
        async for env in store.read_stream(command_stream(command_id)):
            try:
                payload = decode_payload(env)
            except LoopdError:
                payload = Event()  # a type this version does not know still counts for the version
            state = evolve(state, payload, env.version)
            last = env.recorded_at
    except StreamNotFoundError:
        return None
    return None if state is None else msgspec.structs.replace(state, updated_at=parse_or_none(last or None))


async def list_states(store: LogStore) -> list[CommandState]:
    """Every command ever started in this log, oldest first.

    A stream whose id could not be a file name (appended by hand with ``loopd-es append``) is not a command
    this process will touch: it is left out rather than turned into a path.
    """
    out = []
    for stream in await store.streams():
        if stream.startswith(STREAM_PREFIX) and is_valid_id(stream[len(STREAM_PREFIX) :]):
            s = await load_state(store, stream[len(STREAM_PREFIX) :])
            if s is not None:
                out.append(s)
    return sorted(out, key=lambda s: s.created_at or EPOCH)


async def append_decided(
    store: LogStore,
    command_id: str,
    decide: Callable[[CommandState], list[Event]],
    state: CommandState | None = None,
    *,
    causation_id: str | None = None,
    correlation_id: str | None = None,
    called_by: Caller | None = None,
) -> tuple[list[Event], CommandState]:
    """Decide on the current state and append at its version; on a conflict re-read and decide again.

    ``called_by`` (the OpenCode tool call that asked) is stamped on the decided events that record one.

    This is what makes firing exactly-once across processes: whoever loses the race re-decides on a
    state in which the transition already happened, and the decider then returns nothing.

    :raises CommandNotFoundError: when there is no such command; decider errors propagate.
    """
    for _ in range(50):
        if state is None:
            state = await load_state(store, command_id)
            if state is None:
                raise CommandNotFoundError()
        events = stamped(decide(state), called_by)
        if not events:
            return [], state
        new = [
            NewEvent(
                type=e.event_type,
                data=e,
                causation_id=causation_id,
                correlation_id=correlation_id or command_id,
            )
            for e in events
        ]
        try:
            await store.append(command_stream(command_id), new, state.version)
        except WrongExpectedVersionError:
            state = None
            continue
        for e in events:
            state = evolve(state, e)
        assert state is not None
        return events, state
    raise ConflictError(f"command {command_id}: gave up after 50 version conflicts; retry")


def stamped(events: list[Event], called_by: Caller | None) -> list[Event]:
    """``events`` with ``called_by`` set on those whose type records who asked (all of them unchanged without one)."""
    if called_by is None:
        return events
    return [
        msgspec.structs.replace(e, called_by=called_by) if "called_by" in e.__struct_fields__ else e
        for e in events
    ]


# -- start ----------------------------------------------------------------------------------------


class StartSpec:
    """What ``cmd start`` asks for (env values stay here and go only to the process)."""

    def __init__(
        self,
        *,
        title: str,
        command: str,
        args: Sequence[str] = (),
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_seconds: int | None = None,
        shell: bool = False,
        watch: WatchSpec | None = None,
        goal_id: str | None = None,
        cols: int = 80,
        rows: int = 24,
        notify_on_exit: bool | None = None,
        owner_session_id: str | None = None,
        called_by: Caller | None = None,
    ) -> None:
        self.title, self.command, self.args = trim(title), trim(command), list(args)
        self.cwd, self.env, self.timeout_seconds, self.shell = cwd, dict(env or {}), timeout_seconds, shell
        self.watch = None if watch is None or watch.empty else watch
        self.goal_id, self.cols, self.rows, self.notify_on_exit = goal_id, cols, rows, notify_on_exit
        self.owner_session_id = owner_session_id
        self.called_by = called_by


def _check_runnable(spec: StartSpec, env: Mapping[str, str]) -> Path:
    """The resolved working directory, once it and the program are known to exist."""
    cwd = Path(spec.cwd or os.getcwd()).resolve()
    if not cwd.is_dir():
        raise UsageError(f"cwd {str(cwd)!r} is not a directory")
    if spec.shell:
        return cwd
    if "/" in spec.command:
        target = (cwd / spec.command) if not spec.command.startswith("/") else Path(spec.command)
        ok = target.is_file() and os.access(target, os.X_OK)
    else:
        ok = shutil.which(spec.command, path=env.get("PATH", os.defpath)) is not None
    if not ok:
        raise UsageError(f"command {spec.command!r} was not found or is not executable (cwd {str(cwd)!r})")
    return cwd


async def start_command(store: LogStore, store_url: str, spec: StartSpec) -> tuple[str, int]:
    """Validate, record ``command.started``, launch the owner; returns ``(command_id, supervisor_pid)`` at once.

    :raises UsageError: for invalid input (nothing recorded, nothing spawned).
    """
    validate_start(spec.title, spec.command, spec.timeout_seconds, spec.watch, spec.owner_session_id)
    validate_size(spec.cols, spec.rows)
    if spec.goal_id is not None:
        check_id("goal", spec.goal_id)
    validate_process(spec.command, spec.args, spec.cwd, spec.env)
    paths = CommandPaths(store_url)
    child_env = {**os.environ, **spec.env}
    cwd = _check_runnable(spec, child_env)
    paths.ensure()
    await reconcile(store, paths)
    command_id = str(uuid.uuid4())
    paths.socket(command_id)  # a socket directory that is not ours is refused before anything is recorded
    lock_fd = take_lock(paths.lock(command_id))
    assert lock_fd is not None  # a fresh uuid has no owner
    try:
        now = WALL.now()
        started = CommandStarted(
            command_id=command_id,
            title=spec.title,
            command=spec.command,
            args=spec.args,
            cwd=str(cwd),
            shell=spec.shell,
            env_keys=sorted(spec.env),
            timeout_seconds=spec.timeout_seconds,
            deadline_at=deadline_for(now, spec.timeout_seconds),
            cols=spec.cols,
            rows=spec.rows,
            watch=spec.watch,
            goal_id=spec.goal_id,
            notify_on_exit=spec.notify_on_exit,
            started_at=now,
            owner_session_id=spec.owner_session_id,
            machine=paths.machine_id(),
            called_by=spec.called_by,
        )
        await store.append(
            command_stream(command_id),
            [NewEvent(type=started.event_type, data=started, correlation_id=command_id)],
            NO_STREAM,
        )
        pid = await anyio.to_thread.run_sync(_launch_owner, store_url, paths, command_id, child_env, lock_fd)
    finally:
        os.close(lock_fd)  # the owner holds its own copy of the locked descriptor now
    return command_id, pid


def _launch_owner(
    store_url: str, paths: CommandPaths, command_id: str, env: dict[str, str], lock_fd: int
) -> int:
    """Start the detached supervisor; the env reaches it on stdin, never on its command line."""
    root = str(Path(__file__).resolve().parents[2])
    owner_env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p),
    }
    log = paths.supervisor_log(command_id)
    create_private(log)  # 0600: it can hold the command line and its errors
    with log.open("ab") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "loopd_es.procs.supervisor",
                "--store",
                absolute_store_url(store_url),
                "--id",
                command_id,
                "--lock-fd",
                str(lock_fd),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=err,
            pass_fds=(lock_fd,),
            start_new_session=True,
            env=owner_env,
            cwd="/",
        )
    assert proc.stdin is not None
    proc.stdin.write(json.dumps({"env": env}).encode())
    proc.stdin.close()
    threading.Thread(target=proc.wait, daemon=True, name=f"reap-{command_id[:8]}").start()
    return proc.pid


# -- reconcile ------------------------------------------------------------------------------------


async def reconcile(store: LogStore, paths: CommandPaths, only: str | None = None) -> int:
    """Mark running commands whose owner is gone ``missing`` (``timeout`` past their deadline); fire awaits.

    Safe to run from many processes at once: each transition is a version-checked append.
    Returns how many commands were marked missing.
    """
    marked = 0
    states = [s for s in [await load_state(store, only)] if s] if only else await list_states(store)
    for s in states:
        if s.removed:
            await _discard_awaits_of_removed(store, s)
            continue
        if not s.running and not s.awaits:
            continue
        s = await _discard_awaits_of_cleared_goals(store, s)
        if s.running and not paths.runs_here(s.machine):
            continue  # its owner's lock is on the machine that runs it: only that machine can judge it
        if s.running:
            lock = paths.lock(s.id)
            fd = take_lock(lock) if lock.exists() else -1
            if fd is None:
                continue  # a live owner
            try:
                facts = stored_facts(paths.log(s.id))
                events, _ = await append_decided(
                    store, s.id, partial(decide_missing, now=WALL.now(), output=facts), s
                )
                marked += bool(events)
            finally:
                if fd >= 0:
                    os.close(fd)
        else:  # terminal with outstanding awaits (an await raced an exit): fire them now
            facts = stored_facts(paths.log(s.id))
            await append_decided(store, s.id, partial(decide_fire_outstanding, output=facts), s)
    return marked


async def _discard_awaits_of_removed(store: LogStore, s: CommandState) -> None:
    """Discard, with a ledger line each, awaits left on a removed command (the reference's reconcile skipped
    removed commands, so such an await was never settled); the waiting goal is told why."""
    for waiting in s.awaits:
        _, s = await append_decided(
            store, s.id, partial(decide_discard, goal_id=waiting.goal_id, reason="command removed"), s
        )


async def _discard_awaits_of_cleared_goals(store: LogStore, s: CommandState) -> CommandState:
    """Discard awaits whose goal was cleared (a crash between the clear and its cancellations leaves them).

    Only a goal whose own stream ends in ``goal.cleared`` is gone; an await for a goal this log does not
    know is left alone (goals may live in another tool).
    """
    for waiting in s.awaits:
        stream = f"goal-{waiting.goal_id}"
        version = await store.stream_version(stream)
        if not version:
            continue
        last = [e async for e in store.read_stream(stream, from_version=version)]
        if last and last[-1].type == "goal.cleared":
            _, s = await append_decided(
                store, s.id, partial(decide_discard, goal_id=waiting.goal_id, reason="goal gone"), s
            )
    return s


# -- requests to the owner -----------------------------------------------------------------------


async def _signal_directly(store: LogStore, paths: CommandPaths, state: CommandState, op: str) -> str | None:
    """Terminate or kill through the owner's signal handler when its loop does not answer; ``None`` if no owner.

    The owner holds the lock for life, so a held lock means ``supervisor_pid`` is still that owner (no reuse).
    Waits (bounded) for the exit to be recorded, and says so when the owner has not caught up yet.
    """
    pid = state.supervisor_pid
    assert pid is not None
    sig = DIRECT_TERMINATE if op == "terminate" else DIRECT_KILL
    if not owner_alive(paths.lock(state.id)) or not _catches(pid, sig):
        return None
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return None
    end = time.monotonic() + TERMINATE_GRACE_S + OWNER_CONNECT_WAIT_S
    fresh: CommandState | None = state
    while fresh is not None and fresh.running and time.monotonic() < end:
        await anyio.sleep(0.1)
        fresh = await load_state(store, state.id)
    if fresh is not None and not fresh.running:
        if op == "kill":
            return f'Command "{state.title}" killed (SIGKILL).'
        return f'Command "{state.title}" {fresh.status}.'
    what = "SIGTERM (SIGKILL after 3 s)" if op == "terminate" else "SIGKILL"
    return (
        f'{what} sent to "{state.title}" through its owner\'s signal handler (the owner is not answering); '
        "the exit is recorded when it catches up."
    )


def _catches(pid: int, sig: int) -> bool:
    """True when ``pid`` has a handler for ``sig`` (an owner from before the direct path would die of it).

    Reads the caught-signal mask in ``/proc/PID/status``; where there is no ``/proc``, assumes it does.
    """
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except OSError:
        pass
    return True


# -- operations that need no live owner -----------------------------------------------------------


async def remove_command(
    store: LogStore, paths: CommandPaths, command_id: str, *, called_by: Caller | None = None
) -> str:
    """Remove a finished command (refused while running) and delete its output log."""
    await reconcile(store, paths, only=command_id)
    _, state = await append_decided(store, command_id, decide_remove, called_by=called_by)
    for p in (paths.log(command_id), paths.lock(command_id), paths.supervisor_log(command_id)):
        p.unlink(missing_ok=True)
    return f'Command "{state.title}" removed.'


_NOT_RUNNING = {
    "write": "only running commands accept input",
    "interrupt": "nothing to interrupt",
    "kill": "nothing to kill",
    "terminate": "nothing to terminate",
    "watch": "watch is meaningless after exit",
}
_NO_HANDLE = {
    "write": "Process input unavailable (no live handle — host may have restarted; reconcile marks it honestly).",
    "interrupt": "No live handle (host restarted?). Reconcile will mark it missing; use terminate/remove to clean up.",
}


async def resolve_id(store: LogStore, text: str) -> str:
    """A full command id from an id or a unique prefix of at least 4 characters (as ``cmd list`` shows).

    :raises InvalidIdError: for text that is not of the id shape (it never reaches a path or a prefix scan).
    """
    check_id("command", text)
    if await store.stream_version(command_stream(text)) > 0:
        return text
    if len(text) >= 4:
        streams = await store.streams()
        hits = [s[len(STREAM_PREFIX) :] for s in streams if s.startswith(STREAM_PREFIX + text)]
        hits = [h for h in hits if is_valid_id(h)]
        if len(hits) == 1:
            return hits[0]
        if len(hits) > 1:
            raise UsageError(
                f"command id prefix {text!r} is ambiguous ({len(hits)} commands); give more characters"
            )
    raise CommandNotFoundError()


async def command_request(
    store: LogStore, paths: CommandPaths, command_id: str, request: OwnerRequest
) -> str:
    """Send write/interrupt/terminate/kill/resize/watch to the live owner, with the reference's messages.

    ``terminate`` with ``remove`` also removes the command, whether it was still running or not.

    :raises CommandNotFoundError, CommandStateError, UsageError: as the reference words them.
    """
    op = str(type(request).__struct_config__.tag)
    remove = isinstance(request, Terminate | Kill) and request.remove
    caller = request.called_by
    state = await load_state(store, command_id)
    if state is None or state.removed:
        raise CommandNotFoundError()
    if state.running:
        answer = await owner_request(
            paths, command_id, request, ANSWER_WITHIN_S.get(op, OWNER_CONNECT_WAIT_S)
        )
        if answer is None and op in ANSWER_WITHIN_S and state.supervisor_pid:
            direct = await _signal_directly(store, paths, state, op)
            if direct is not None:
                answer = OwnerAnswer(ok=True, message=direct)
        if answer is not None and answer.ok:
            message = answer.message
            if remove:
                await remove_command(store, paths, command_id, called_by=caller)
                message = message.rstrip(".") + "; removed."
            return message
        if answer is not None and answer.code == 2:
            raise UsageError(answer.message)
        if answer is None:
            if (
                op in _NO_HANDLE
            ):  # as the reference: say so and leave it to reconcile (a failed call records nothing)
                raise CommandStateError(_NO_HANDLE[op])
            await reconcile(store, paths, only=command_id)
        state = await load_state(store, command_id)
        assert state is not None
        if state.running:  # the owner refused for another reason
            raise CommandStateError(answer.message if answer else "no live owner")
    if isinstance(request, Resize):  # the size is stored whether or not there is a terminal to apply it to
        _, state = await append_decided(
            store, command_id, partial(decide_resize, cols=request.cols, rows=request.rows), called_by=caller
        )
        return (
            f'Terminal size {request.cols}x{request.rows} stored for "{state.title}" '
            f"(command is {state.status}; no terminal to resize)."
        )
    if op == "terminate" and remove:
        try:
            await remove_command(store, paths, command_id, called_by=caller)
        except LoopdError as e:
            raise CommandStateError(f"Command is {state.status}; remove failed: {e}") from None
        return f"Command was already {state.status}; removed."
    raise CommandStateError(f"Command is {state.status}; {_NOT_RUNNING.get(op, 'nothing to do')}.")
