"""Where a command's files live, and how anyone tells whether its owner is alive.

Beside the log, ``commands/`` holds per command: ``<id>.log`` (output), ``<id>.lock`` (held with
``flock`` by the owner for exactly as long as it lives), ``<id>.sock`` (the owner's request socket) and
``<id>.supervisor.log`` (the owner's own diagnostics). The lock, not a pid, is the liveness test: the
kernel drops it when the owner dies however it dies, and pids are reused.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
from pathlib import Path

from ..log import parse_store_url

_MAX_SOCKET_PATH = 100  # sun_path is 108 bytes on Linux, 104 on macOS


def absolute_store_url(url: str) -> str:
    """The same store with an absolute path, so an owner started elsewhere opens the same log."""
    scheme, path, options = parse_store_url(url)
    query = "&".join(f"{k}={v}" for k, v in options.items())
    return f"{scheme}:{Path(path).resolve()}" + (f"?{query}" if query else "")


class CommandPaths:
    """The per-command files of one store."""

    def __init__(self, store_url: str) -> None:
        _, path, _ = parse_store_url(store_url)
        self.root = Path(path).resolve().parent / "commands"

    def ensure(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)

    def log(self, command_id: str) -> Path:
        return self.root / f"{command_id}.log"

    def lock(self, command_id: str) -> Path:
        return self.root / f"{command_id}.lock"

    def supervisor_log(self, command_id: str) -> Path:
        return self.root / f"{command_id}.supervisor.log"

    def socket(self, command_id: str) -> Path:
        """``<id>.sock`` beside the log, or a hashed name under the temp dir when that path is too long."""
        path = self.root / f"{command_id}.sock"
        if len(str(path)) <= _MAX_SOCKET_PATH:
            return path
        digest = hashlib.sha256(str(path).encode()).hexdigest()[:24]
        short = Path(tempfile.gettempdir()) / f"loopd-es-{os.getuid()}"
        short.mkdir(mode=0o700, exist_ok=True)
        return short / f"{digest}.sock"


def take_lock(path: Path) -> int | None:
    """Take the owner lock without waiting: the locked fd, or ``None`` if a live owner holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def owner_alive(path: Path) -> bool:
    """True while some process holds the command's owner lock."""
    if not path.exists():
        return False
    fd = take_lock(path)
    if fd is None:
        return True
    os.close(fd)
    return False
