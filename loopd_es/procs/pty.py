"""A child in a real pseudo-terminal, driven from anyio without blocking the event loop.

ptyprocess does the fork, the PTY setup and exec-error reporting; after that this module owns the
master fd and the pid itself: the fd is made non-blocking and read when anyio reports it readable, and
the exit is awaited on a pidfd (Linux) so an idle child costs no CPU at all. Nothing else may call
``waitpid`` on the child, which is why ptyprocess's own ``isalive``/``close`` are never used.
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import struct
import termios
from collections.abc import Mapping, Sequence
from functools import partial

import anyio
import anyio.lowlevel
from ptyprocess import PtyProcess  # the only import of ptyprocess in the package
from ptyprocess.util import which

_RESET_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGPIPE, signal.SIGXFSZ)
"""Signals a child must meet with their default action, as in a terminal: an ignored signal stays ignored
across exec, and Python ignores SIGPIPE and SIGXFSZ, while a shell's background job ignores SIGINT and SIGQUIT
(an owner started that way made children that ``interrupt`` could not stop), and the owner ignores SIGHUP (a
child that inherited that outlived an owner killed with -9: its terminal's hang-up did not end it)."""


def _default_signals() -> None:
    """Run in the forked child before exec: restore the default action of :data:`_RESET_SIGNALS`."""
    for sig in _RESET_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


def _exec_in_child(argv: list[str], env: dict[str, str]) -> None:
    """Run in the forked child as ptyprocess's ``preexec_fn``: reset the signals and exec ``argv`` here.

    ptyprocess's own exec reports only an ``OSError`` to the parent; anything else (a ``ValueError`` for a NUL
    byte or an ``=`` in an environment name) escaped in the child, which then ran on as a second copy of the
    owner and printed its traceback into the command's output. Here every failure becomes an ``OSError`` that
    ptyprocess sends to the parent (and ends the child); the parent records it as a failed spawn (exit 127).
    """
    try:
        _default_signals()
        os.execve(argv[0], argv, env)
    except OSError:
        raise
    except BaseException as e:  # the child must never run on as the owner
        raise OSError(errno.EINVAL, f"cannot exec {argv[0]!r}: {type(e).__name__}: {e}") from None


class PtyChild:
    """One spawned process: its pid, its PTY master, and its exit status once reaped."""

    def __init__(self, proc: PtyProcess) -> None:
        self._proc = proc
        self.pid: int = proc.pid
        self.fd: int = proc.fd
        os.set_blocking(self.fd, False)
        self.exit_code: int | None = None
        self.signal: str | None = None
        self.reaped = False
        self.eof = False

    @classmethod
    def spawn(
        cls, argv: Sequence[str], *, cwd: str, env: Mapping[str, str], cols: int, rows: int
    ) -> PtyChild:
        """Fork and exec ``argv`` on a new PTY (the child leads its own session and process group).

        :raises OSError: when the program cannot be found or executed.
        """
        child_env = dict(env)
        resolved = which(argv[0], path=child_env.get("PATH", os.defpath)) if argv else None
        if resolved is None:
            raise FileNotFoundError(f"The command was not found or was not executable: {list(argv)[:1]!r}.")
        full = [resolved, *argv[1:]]
        proc = PtyProcess.spawn(
            full,
            cwd=cwd,
            env=child_env,
            dimensions=(rows, cols),
            preexec_fn=partial(_exec_in_child, full, child_env),
        )
        return cls(proc)

    async def read(self, size: int = 65536) -> bytes:
        """The next chunk of output, or ``b""`` once every writer of the PTY is gone."""
        while not self.eof:
            try:
                data = os.read(self.fd, size)
            except BlockingIOError:
                await anyio.wait_readable(self.fd)
                continue
            except OSError as e:
                if e.errno != errno.EIO:
                    raise
                data = b""  # Linux reports a closed slave side as EIO
            if not data:
                self.eof = True
            # When the child floods, data is always ready and nothing above awaits: yield here, or the
            # owner's loop never answers a request until the flood pauses.
            await anyio.lowlevel.checkpoint()
            return data
        return b""

    def read_nowait(self, size: int = 65536) -> bytes | None:
        """Whatever is readable now: bytes, ``b""`` at EOF, ``None`` when nothing is pending."""
        if self.eof:
            return b""
        try:
            data = os.read(self.fd, size)
        except BlockingIOError:
            return None
        except OSError as e:
            if e.errno != errno.EIO:
                raise
            data = b""
        if not data:
            self.eof = True
        return data

    async def write(self, data: bytes) -> None:
        """Write all of ``data`` to the terminal, waiting while the PTY buffer is full."""
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.fd, view)
            except BlockingIOError:
                await anyio.wait_writable(self.fd)
                continue
            view = view[n:]

    def send_signal(self, sig: int) -> bool:
        """Signal the child's process group (so ``sh -c`` pipelines stop too); False once it is gone."""
        if self.reaped:
            return False
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                return False
        except PermissionError:
            return False
        return True

    def resize(self, cols: int, rows: int) -> None:
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    async def wait(self) -> tuple[int | None, str | None]:
        """Reap the child: ``(exit_code, None)`` or ``(None, "SIGTERM")``; idempotent."""
        if not self.reaped:
            try:
                pidfd = os.pidfd_open(self.pid)
            except (AttributeError, OSError):
                pidfd = -1
            try:
                while True:
                    pid, status = os.waitpid(self.pid, os.WNOHANG)  # noqa: ASYNC222 - WNOHANG never blocks
                    if pid:
                        break
                    if pidfd >= 0:
                        await anyio.wait_readable(pidfd)
                    else:
                        await anyio.sleep(0.05)
            finally:
                if pidfd >= 0:
                    os.close(pidfd)
            self.reaped = True
            if os.WIFSIGNALED(status):
                self.signal = signal.Signals(os.WTERMSIG(status)).name
            else:
                self.exit_code = os.waitstatus_to_exitcode(status)
        return self.exit_code, self.signal

    def close(self) -> None:
        """Close the PTY master (once) without letting ptyprocess reap or signal anything."""
        if not self._proc.closed:
            self._proc.fileobj.close()
            self._proc.closed = True
