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
import socket
import stat
import struct
import tempfile
import uuid
from pathlib import Path

from ..errors import StorageError
from ..ids import path_under
from ..log import POSTGRES_SCHEMES, parse_store_url
from ..log.postgres_url import split_postgres_url

_MAX_SOCKET_PATH = 100  # sun_path is 108 bytes on Linux, 104 on macOS


def absolute_store_url(url: str) -> str:
    """The same store with an absolute path, so an owner started elsewhere opens the same log."""
    if url.startswith(POSTGRES_SCHEMES):
        return url  # a server's address means the same from any directory
    scheme, path, options = parse_store_url(url)
    query = "&".join(f"{k}={v}" for k, v in options.items())
    return f"{scheme}:{Path(path).resolve()}" + (f"?{query}" if query else "")


def server_log_commands_dir(store_url: str) -> Path:
    """Where this machine keeps the files of its commands for a log on a database server.

    Commands are processes of this machine, so their files stay here, whatever directory a command or its
    owner runs in: ``$XDG_STATE_HOME/loopd-es/commands-<schema>-<hash of the server URL>`` (default
    ``~/.local/state``).
    """
    conninfo, schema = split_postgres_url(store_url)
    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    digest = hashlib.sha256(conninfo.encode()).hexdigest()[:12]
    return state / "loopd-es" / f"commands-{schema}-{digest}"


class CommandPaths:
    """The per-command files of one store."""

    def __init__(self, store_url: str) -> None:
        if store_url.startswith(POSTGRES_SCHEMES):
            self.root = server_log_commands_dir(store_url)
            return
        _, path, _ = parse_store_url(store_url)
        self.root = Path(path).resolve().parent / "commands"

    def ensure(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)

    def machine_id(self) -> str:
        """This machine's id for the log's commands, kept in its command directory (made on first use).

        A command records it when it starts; only a process that finds the same id judges whether the
        command's owner is alive (its lock file is only here). Two machines on one PostgreSQL log have two
        directories, so two ids.
        """
        path = self.root / "machine-id"
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            pass
        self.ensure()
        made = uuid.uuid4().hex[:16]
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return path.read_text().strip()  # another process made it meanwhile
        with os.fdopen(fd, "w") as out:
            out.write(made + "\n")
        return made

    def runs_here(self, machine: str) -> bool:
        """Whether a command recorded on ``machine`` runs on this machine (``""``: recorded before ids)."""
        return not machine or machine == self.machine_id()

    # Every builder goes through path_under: an id that could name a file elsewhere is refused here too.

    def log(self, command_id: str) -> Path:
        return path_under(self.root, "command", command_id, ".log")

    def lock(self, command_id: str) -> Path:
        return path_under(self.root, "command", command_id, ".lock")

    def supervisor_log(self, command_id: str) -> Path:
        return path_under(self.root, "command", command_id, ".supervisor.log")

    def socket(self, command_id: str) -> Path:
        """``<id>.sock`` beside the log, or a hashed name under a private temp dir when that path is too long.

        Either way the directory holding it must be ours and closed to others (see :func:`private_dir`).

        :raises UnsafeDirectoryError: when it is not.
        """
        path = path_under(self.root, "command", command_id, ".sock")
        if len(str(path)) <= _MAX_SOCKET_PATH:
            if self.root.exists():  # missing: nobody can listen there, and a connect simply fails
                check_private(self.root)
            return path
        digest = hashlib.sha256(str(path).encode()).hexdigest()[:24]
        short = private_dir(Path(tempfile.gettempdir()) / f"loopd-es-{os.getuid()}")
        return short / f"{digest}.sock"


class UnsafeDirectoryError(StorageError):
    """Raised when a directory meant to hold an owner's socket belongs to another user or others can write it."""

    def __init__(self, path: Path, problem: str, what: str = "command sockets") -> None:
        super().__init__(
            f"refusing to use {str(path)!r} for {what}: {problem}; remove it (or point TMPDIR at a "
            "directory only you can write) and retry"
        )


def check_private(path: Path, what: str = "command sockets") -> Path:
    """``path`` when it is a real directory (not a symlink) owned by us that nobody else can write.

    :raises UnsafeDirectoryError: otherwise.
    """
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirectoryError(path, "it is not a directory (a symlink?)", what)
    if st.st_uid != os.getuid():
        raise UnsafeDirectoryError(
            path, f"it belongs to uid {st.st_uid}, not to you (uid {os.getuid()})", what
        )
    if st.st_mode & 0o022:
        raise UnsafeDirectoryError(path, f"others can write it (mode {stat.S_IMODE(st.st_mode):04o})", what)
    return path


def private_dir(path: Path) -> Path:
    """Create ``path`` with mode 0700 if it is missing, then :func:`check_private` it (whoever created it)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    return check_private(path)


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a connected Unix socket (``SO_PEERCRED``, Linux)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


def same_user(sock: socket.socket) -> bool:
    """True when the peer runs as our uid: the only one an owner serves and a client talks to."""
    return peer_uid(sock) == os.getuid()


class ForeignOwnerError(StorageError):
    """Raised when the process serving a command's socket runs as another user (a replaced socket)."""

    def __init__(self, path: Path, uid: int) -> None:
        super().__init__(
            f"refusing to talk to {str(path)!r}: it is served by uid {uid}, not by you (uid {os.getuid()}), "
            "so it is not this command's owner; nothing was sent"
        )


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
