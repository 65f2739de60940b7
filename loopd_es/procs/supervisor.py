"""The owner of one command: ``python -m loopd_es.procs.supervisor --store URL --id ID --lock-fd N``.

Launched detached by ``cmd start`` (see :mod:`loopd_es.procs.service`), it inherits the locked owner
lock, reads the child's environment from stdin, spawns the PTY, and until the child ends: copies output
to the output log, runs the watch and until-awaits on each line, enforces the deadline, serves requests
on its socket, and appends every transition through :func:`append_decided`. It exits once the terminal
event is recorded and the requests in flight are answered.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import logging
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import anyio
from anyio.abc import SocketAttribute, SocketStream, TaskGroup
from anyio.streams.buffered import BufferedByteReceiveStream
from anyio.streams.memory import MemoryObjectSendStream

from ..clock import WALL
from ..domain.command import (
    MAX_OUTPUT_BYTES,
    TERMINATE_GRACE_S,
    CommandState,
    CommandStateError,
    compile_watch_regex,
    decide_exit,
    decide_resize,
    decide_signal,
    decide_until_fired,
    decide_until_stop,
    decide_watch,
    decide_write,
    validate_size,
)
from ..errors import LoopdError, UsageError
from ..events.command import CommandSpawned, SignalName, SignalReason, WatchSpec
from ..log import open_store
from .outlog import OutputLog, until_matches
from .owner_link import (
    MAX_LINE,
    AnyRequest,
    Attach,
    Interrupt,
    Kill,
    OwnerAnswer,
    Refresh,
    Resize,
    Status,
    Terminate,
    Watch,
    Write,
    decode_request,
    encode,
)
from .paths import CommandPaths, peer_uid
from .pty import PtyChild
from .service import DIRECT_KILL, DIRECT_TERMINATE, append_decided, load_state, reconcile
from .text import LineAssembler, clean_line
from .watch import Watcher

if TYPE_CHECKING:
    from ..events.base import Caller, Event
    from ..log.base import LogStore
    from ..patterns import UserPattern

log = logging.getLogger("loopd_es.procs")

STALL_ENV = "LOOPD_ES_TEST_STALL_ON"
"""A test hook like the crash points: ``TEXT:SECONDS`` makes the owner's loop spin that long on a line holding
TEXT, standing in for anything that keeps the loop from running (tests of the direct signal path)."""


class Supervisor:
    """Everything one command's owner holds in memory (rebuilt from the log where it matters)."""

    def __init__(
        self, store: LogStore, paths: CommandPaths, state: CommandState, env: dict[str, str]
    ) -> None:
        self.store, self.paths, self.state, self.env = store, paths, state, env
        self.id = state.id
        self.out = OutputLog(paths.log(self.id))
        self.lines = LineAssembler()
        self.watcher: Watcher | None = None
        self.until_awaits: dict[str, UserPattern] = {}
        self.child: PtyChild | None = None
        self.lock = anyio.Lock()
        self.finished = anyio.Event()
        self.reader_done = anyio.Event()
        self.wake_timer = anyio.Event()
        self.attached: set[MemoryObjectSendStream[bytes]] = set()
        self.pending = 0
        self.idle = anyio.Event()
        self._tg: TaskGroup | None = None
        self.direct: tuple[SignalName, SignalReason] | None = None
        self._stall = _stall_hook()
        self._set_watch(state.watch)
        self._load_awaits()

    # -- bookkeeping --------------------------------------------------------------------------------

    async def append(
        self, decide: Callable[[CommandState], list[Event]], called_by: Caller | None = None
    ) -> list[Event]:
        """Decide and append, serialised within this owner and shielded from cancellation; ``called_by`` is
        the tool call that asked, if one did."""
        with anyio.CancelScope(shield=True):
            async with self.lock:
                events, self.state = await append_decided(
                    self.store, self.id, decide, self.state, called_by=called_by
                )
        return events

    def _set_watch(self, spec: WatchSpec | None) -> None:
        self.watcher = None if spec is None or spec.empty else Watcher(self.id, self.state.title, spec)
        self.wake_timer.set()

    def _load_awaits(self) -> None:
        self.until_awaits = {
            a.goal_id: compile_watch_regex("until", a.until, a.ignore_case)
            for a in self.state.awaits
            if a.until
        }

    # -- the run ------------------------------------------------------------------------------------

    async def run(self) -> int:
        s = self.state
        argv = ["/bin/sh", "-c", shlex.join([s.command, *s.args])] if s.shell else [s.command, *s.args]
        signal.signal(DIRECT_TERMINATE, self._on_direct_signal)
        signal.signal(DIRECT_KILL, self._on_direct_signal)
        try:
            sock = self.paths.socket(self.id)  # refused before anything runs when its directory is not ours
            self.child = PtyChild.spawn(argv, cwd=s.cwd, env=self.env, cols=s.cols, rows=s.rows)
        except (OSError, ValueError, LoopdError) as e:
            msg = f"spawn failed: {e}"
            await self.append(
                lambda st: decide_exit(
                    st, exit_code=127, signal=None, now=WALL.now(), output=self.out.facts(), error=msg
                )
            )
            return 1
        child = self.child
        await self.append(
            lambda st: (
                [CommandSpawned(command_id=self.id, pid=child.pid, supervisor_pid=os.getpid())]
                if st.running
                else []
            )
        )
        sock.unlink(missing_ok=True)
        listener = await anyio.create_unix_listener(sock)
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                tg.start_soon(self._pump)
                tg.start_soon(self._flush_timer)
                tg.start_soon(self._deadline)
                tg.start_soon(listener.serve, self._handle, tg)
                tg.start_soon(reconcile, self.store, self.paths)  # an owner's start reconciles the others
                await self._reap()
                with anyio.move_on_after(TERMINATE_GRACE_S + 3):
                    while self.pending:
                        self.idle = anyio.Event()
                        await self.idle.wait()
                tg.cancel_scope.cancel()
        finally:
            await listener.aclose()
            sock.unlink(missing_ok=True)
            child.close()
            self.out.close()
        return 0

    async def _pump(self) -> None:
        assert self.child is not None
        while True:
            data = await self.child.read()
            if not data:
                break
            await self._on_output(data)
        self.reader_done.set()

    async def _on_output(self, data: bytes) -> None:
        self.out.append(data)
        if self._stall is not None and self._stall[0] in data:
            _spin(self._stall[1])
        for client in list(self.attached):
            try:
                client.send_nowait(data)
            except (anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
                self.attached.discard(client)  # a client that cannot keep up is detached
                client.close()
        lines = self.lines.feed(data)
        if lines and (self.watcher is not None or self.until_awaits):
            await self._on_lines(lines)

    async def _on_lines(self, raw_lines: list[str]) -> None:
        now = time.monotonic()
        for raw in raw_lines:
            line = clean_line(raw)
            if not line.strip():
                continue
            w = self.watcher
            if (
                w is not None
            ):  # a suspended watch still counts the line it drops (the reference's droppedLines)
                events = w.feed(line, now)
                if events:
                    await self.append(_if_running(events))
                    if w.until_matched and w.spec.until_action == "stop":
                        w.until_matched = False
                        assert self._tg is not None
                        self._tg.start_soon(self._terminate, "until")
                if w.deadline is not None:
                    self.wake_timer.set()
            for goal_id, pattern in list(self.until_awaits.items()):
                if pattern.search(line):
                    del self.until_awaits[goal_id]
                    await self.append(
                        partial(
                            decide_until_fired, goal_id=goal_id, matched=[line], tail=self.out.facts().tail
                        )
                    )

    async def _flush_timer(self) -> None:
        while True:
            w = self.watcher
            deadline = None if w is None else w.deadline
            self.wake_timer = anyio.Event()
            if deadline is None:
                await self.wake_timer.wait()
                continue
            with anyio.move_on_after(max(0.0, deadline - time.monotonic())):
                await self.wake_timer.wait()
            if w is self.watcher and w is not None:
                events = w.due(time.monotonic())
                if events:
                    await self.append(_if_running(events))

    async def _deadline(self) -> None:
        if self.state.deadline_at is None:
            return
        end = self.state.deadline_at
        await anyio.sleep(max(0.0, (end - WALL.now()).total_seconds()))
        if not self.finished.is_set():
            await self._terminate("timeout")

    async def _reap(self) -> None:
        assert self.child is not None
        code, sig = await self.child.wait()
        if self.direct is not None:  # signalled from the handler while the loop could not record it
            name, reason = self.direct
            await self.append(
                lambda st: decide_signal(st, name, reason) if st.running and st.signal != name else []
            )
        with anyio.move_on_after(0.5):  # output still in the PTY after the exit
            await self.reader_done.wait()
        tail = self.lines.flush()
        if tail and (self.watcher is not None or self.until_awaits):
            await self._on_lines(tail)
        if self.watcher is not None and self.state.watch_state != "until-matched":
            events = self.watcher.at_exit()
            if events:
                await self.append(lambda st: events if st.running else [])
        facts = self.out.facts()
        w = self.watcher
        dropped = w.dropped if w is not None and w.suspended else None
        await self.append(
            lambda st: decide_exit(
                st, exit_code=code, signal=sig, now=WALL.now(), output=facts, watch_dropped=dropped
            )
        )
        self.finished.set()
        for client in list(self.attached):
            client.close()

    # -- signals ------------------------------------------------------------------------------------

    async def _terminate(self, reason: SignalReason, called_by: Caller | None = None) -> None:
        """SIGTERM, a 3 s grace, then SIGKILL; returns once the exit is recorded."""
        assert self.child is not None
        if reason == "until":
            claimed = await self.append(decide_until_stop)
        else:
            claimed = await self.append(lambda st: decide_signal(st, "SIGTERM", reason), called_by)
        if not claimed:
            await self.finished.wait()
            return
        self.child.send_signal(signal.SIGTERM)
        with anyio.move_on_after(TERMINATE_GRACE_S):
            await self.finished.wait()
        if not self.finished.is_set():
            await self.append(lambda st: decide_signal(st, "SIGKILL", reason) if st.running else [])
            self.child.send_signal(signal.SIGKILL)
            await self.finished.wait()

    def _on_direct_signal(self, signum: int, _frame: object) -> None:
        """``SIGUSR1`` (terminate) / ``SIGUSR2`` (kill) from a client whose request went unanswered.

        Runs as a signal handler, between two bytecodes of whatever the loop is doing, so it reaches the
        child even when the loop is busy; :meth:`_reap` records the signal with the exit.
        """
        child = self.child
        if child is None or child.reaped:
            return
        if signum == DIRECT_KILL:
            self.direct = ("SIGKILL", "kill")
            child.send_signal(signal.SIGKILL)
            return
        if self.direct is not None:
            return
        self.direct = ("SIGTERM", "terminate")
        child.send_signal(signal.SIGTERM)

        def escalate() -> None:
            if not child.reaped and child.send_signal(signal.SIGKILL):
                self.direct = ("SIGKILL", "terminate")

        timer = threading.Timer(TERMINATE_GRACE_S, escalate)
        timer.daemon = True
        timer.start()

    # -- requests ---------------------------------------------------------------------------------

    async def _handle(self, stream: SocketStream) -> None:
        uid = peer_uid(stream.extra(SocketAttribute.raw_socket))
        if uid != os.getuid():  # only our own user may type into the command or signal it
            log.warning("command %s: refused a connection from uid %d", self.id, uid)
            await stream.aclose()
            return
        self.pending += 1
        try:
            async with stream:
                buffered = BufferedByteReceiveStream(stream)
                try:
                    line = await buffered.receive_until(b"\n", MAX_LINE)
                except (anyio.EndOfStream, anyio.IncompleteRead, OSError):
                    return
                answer: OwnerAnswer
                try:
                    request = decode_request(line)
                except UsageError as e:
                    answer = OwnerAnswer(ok=False, message=str(e), code=e.exit_code)
                    with anyio.move_on_after(5):
                        await stream.send(encode(answer))
                    return
                if isinstance(request, Attach):
                    self.pending -= 1
                    try:
                        await self._attach(stream, buffered)
                    finally:
                        self.pending += 1
                    return
                try:
                    answer = await self._dispatch(request)
                except LoopdError as e:
                    answer = OwnerAnswer(ok=False, message=str(e), code=e.exit_code)
                except binascii.Error as e:
                    answer = OwnerAnswer(ok=False, message=f"bad request: data is not base64 ({e})", code=2)
                with anyio.move_on_after(5):
                    await stream.send(encode(answer))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        finally:
            self.pending -= 1
            self.idle.set()

    async def _dispatch(self, r: AnyRequest) -> OwnerAnswer:
        title = self.state.title
        child = self.child
        assert child is not None
        if isinstance(r, Status):
            w = self.watcher
            return OwnerAnswer(
                ok=True,
                message=self.state.status,
                pid=child.pid,
                stream_bytes=self.out.stream_bytes,
                output_bytes=min(self.out.size, MAX_OUTPUT_BYTES),
                watch_state=w.state if w else None,
                dropped=w.dropped if w else 0,
            )
        if isinstance(r, Refresh):
            async with self.lock:
                fresh = await load_state(self.store, self.id)
                if fresh is not None:
                    self.state = fresh
            known = set(self.until_awaits)
            self._load_awaits()
            for goal_id, pattern in list(self.until_awaits.items()):
                if goal_id in known:
                    continue
                matched = until_matches(self.out.path, pattern)
                if matched:
                    del self.until_awaits[goal_id]
                    await self.append(
                        partial(
                            decide_until_fired, goal_id=goal_id, matched=matched, tail=self.out.facts().tail
                        )
                    )
            return OwnerAnswer(ok=True, message="refreshed")
        op = type(r).__struct_config__.tag
        if self.finished.is_set() or not self.state.running:
            await self.finished.wait()
            raise _state_error(str(op), self.state)
        if isinstance(r, Write):
            data = base64.b64decode(r.data, validate=True)
            await self.append(lambda st: decide_write(st, len(data)), r.called_by)
            await child.write(data)
            return OwnerAnswer(ok=True, message=f'Sent {len(data)} byte(s) to "{title}".')
        if isinstance(r, Interrupt):
            await self.append(lambda st: decide_signal(st, "SIGINT", "interrupt"), r.called_by)
            if not child.send_signal(signal.SIGINT):
                return OwnerAnswer(ok=False, message="Failed to deliver SIGINT.", code=3)
            return OwnerAnswer(
                ok=True,
                message=f'SIGINT delivered to "{title}" (process may continue if it traps the signal).',
            )
        if isinstance(r, Terminate):
            await self._terminate("terminate", r.called_by)
            return OwnerAnswer(
                ok=True, message=f'Command "{title}" {self.state.status}.', status=self.state.status
            )
        if isinstance(r, Kill):
            await self.append(lambda st: decide_signal(st, "SIGKILL", "kill"), r.called_by)
            child.send_signal(signal.SIGKILL)
            await self.finished.wait()
            return OwnerAnswer(ok=True, message=f'Command "{title}" killed (SIGKILL).')
        if isinstance(r, Resize):
            cols, rows = r.cols, r.rows
            validate_size(cols, rows)
            child.resize(cols, rows)
            await self.append(lambda st: decide_resize(st, cols, rows), r.called_by)
            return OwnerAnswer(ok=True, message=f'Terminal resized to {cols}x{rows} for "{title}".')
        if isinstance(r, Watch):
            spec = WatchSpec(
                filter=r.filter, until=r.until, ignore_case=r.ignore_case, until_action=r.until_action
            )
            await self.append(lambda st: decide_watch(st, spec, clear=r.clear), r.called_by)
            self._set_watch(None if r.clear else spec)
            if r.clear:
                return OwnerAnswer(ok=True, message=f'Watch cleared for "{title}".')
            shown = (
                (f'filter="{spec.filter}"' if spec.filter else "filter=—")
                + "  "
                + (f'until="{spec.until}"' if spec.until else "until=—")
            )
            return OwnerAnswer(
                ok=True,
                message=f'Watch set for "{title}" ({shown}  action={spec.until_action}; counters reset to active).',
            )
        raise UsageError(f"unknown request {op!r}")

    async def _attach(self, stream: SocketStream, buffered: BufferedByteReceiveStream) -> None:
        """Stream live output to the client and its keystrokes to the child until either side ends."""
        assert self.child is not None
        send, receive = anyio.create_memory_object_stream[bytes](1024)
        self.attached.add(send)
        typed = 0
        await stream.send(json.dumps({"ok": True, "message": "attached"}).encode() + b"\n")
        try:
            async with anyio.create_task_group() as tg, receive:

                async def forward_output() -> None:
                    try:
                        async for chunk in receive:
                            await stream.send(chunk)
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                        pass  # the client went away with output on its way: the attach ends, the owner goes on
                    tg.cancel_scope.cancel()

                tg.start_soon(forward_output)
                while True:
                    try:
                        data = await buffered.receive()
                    except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                        break
                    if self.finished.is_set():
                        continue
                    await self.child.write(data)
                    typed += len(data)
                tg.cancel_scope.cancel()
        finally:
            self.attached.discard(send)
            send.close()
            if typed and not self.finished.is_set():
                await self.append(lambda st: decide_write(st, typed) if st.running else [])


def _if_running(events: list[Event]) -> Callable[[CommandState], list[Event]]:
    return lambda st: events if st.running else []


def _state_error(op: str, s: CommandState) -> LoopdError:
    what = {
        "write": "only running commands accept input",
        "interrupt": "nothing to interrupt",
        "kill": "nothing to kill",
        "watch": "watch is meaningless after exit",
        "resize": "nothing to resize",
    }.get(op, "nothing to terminate")
    return CommandStateError(f"Command is {s.status}; {what}.")


def _stall_hook() -> tuple[bytes, float] | None:
    text, sep, seconds = os.environ.get(STALL_ENV, "").rpartition(":")
    return (text.encode(), float(seconds)) if sep and text else None


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:  # busy on purpose: a loop that never yields, as a runaway match would be
        pass


async def _main(store_url: str, command_id: str, lock_fd: int, env: dict[str, str]) -> int:
    paths = CommandPaths(store_url)
    async with await open_store(store_url) as store:
        state = await load_state(store, command_id)
        if state is None or not state.running:
            return 0
        return await Supervisor(store, paths, state, env).run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="loopd_es.procs.supervisor")
    parser.add_argument("--store", required=True)
    parser.add_argument("--id", required=True)
    parser.add_argument("--lock-fd", type=int, required=True)
    args = parser.parse_args(argv)
    spec = json.loads(sys.stdin.buffer.read() or b"{}")
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        return anyio.run(_main, args.store, args.id, args.lock_fd, dict(spec.get("env", {})))
    finally:
        os.close(args.lock_fd)  # the kernel would drop it anyway; say it explicitly


if __name__ == "__main__":
    raise SystemExit(main())
