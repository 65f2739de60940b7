"""Command owner sockets cannot be hijacked: a private directory, and the peer's uid checked both ways.

"Another user" is ``nobody`` (uid 65534): a directory chowned to it, or a forked child that drops to it
before it connects or listens, so ``SO_PEERCRED`` reports that uid. Needs root, as the tests run here.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest

from loopd_es.cli.main import main
from loopd_es.log import open_store
from loopd_es.procs import owner_link, service
from loopd_es.procs.paths import CommandPaths, ForeignOwnerError, UnsafeDirectoryError, check_private

from .test_procs_support import Env, env, store

if TYPE_CHECKING:
    from loopd_es.log.base import LogStore

__all__ = ["env", "store"]
NOBODY = 65534
pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="simulating another user needs root")

SLEEPER = "import time\nprint('ready', flush=True)\ntime.sleep(60)\n"


def as_nobody(work: Callable[[], bytes], cwd: Path) -> bytes:
    """Run ``work`` in a forked child in ``cwd`` that has dropped to uid/gid 65534; its result comes back on a pipe.

    The child enters ``cwd`` while still root, so only ``cwd`` itself must let nobody in (pytest's temp
    directories are closed to other users all the way up).
    """
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(r)
            os.chdir(cwd)
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            os.write(w, work())
        finally:
            os._exit(0)
    os.close(w)
    chunks = []
    with os.fdopen(r, "rb") as f:
        while chunk := f.read(65536):
            chunks.append(chunk)
    os.waitpid(pid, 0)
    return b"".join(chunks)


def _long_store(tmp_path: Path) -> str:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    return f"sqlite:{deep / 'events.db'}"


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A TMPDIR of our own (this process and the owners it starts), so the hashed socket dir lands in it."""
    tmp = tmp_path / "tmp"
    tmp.mkdir(mode=0o755)
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp


def test_short_socket_dir_is_created_0700_and_foreign_ones_are_refused(
    tmp_path: Path, private_tmp: Path
) -> None:
    paths = CommandPaths(_long_store(tmp_path))
    paths.ensure()
    short = private_tmp / f"loopd-es-{os.getuid()}"
    sock = paths.socket("c1")
    assert sock.parent == short and (short.stat().st_mode & 0o777) == 0o700

    os.chown(short, NOBODY, NOBODY)  # another user got there first
    with pytest.raises(UnsafeDirectoryError, match="belongs to uid 65534"):
        paths.socket("c1")
    os.chown(short, 0, 0)
    short.chmod(0o777)
    with pytest.raises(UnsafeDirectoryError, match="others can write it"):
        paths.socket("c1")
    short.rmdir()
    short.symlink_to(tmp_path)
    with pytest.raises(UnsafeDirectoryError, match="not a directory"):
        paths.socket("c1")


def test_start_refuses_a_hijacked_socket_dir_and_records_nothing(
    tmp_path: Path, private_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reported attack: ``$TMPDIR/loopd-es-<uid>/`` made by another user before the owner starts."""
    url = _long_store(tmp_path)
    short = private_tmp / f"loopd-es-{os.getuid()}"
    short.mkdir(mode=0o777)
    short.chmod(0o777)
    os.chown(short, NOBODY, NOBODY)
    capsys.readouterr()
    assert main("--store", url, "cmd", "start", "--", "true") == 4
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "refusing to use" in err and "belongs to uid 65534" in err

    async def streams() -> list[str]:
        async with await open_store(url) as s:
            return await s.streams()

    assert anyio.run(streams) == []
    assert list(short.iterdir()) == []


@pytest.mark.anyio
async def test_owner_serves_only_its_own_user(env: Env, store: LogStore) -> None:
    """Even with the socket left reachable, a connection from another uid is closed unanswered."""
    cid = await env.start(store, "-c", SLEEPER, title="sleeper")
    await env.until(store, cid, lambda s: b"ready" in env.output(cid))
    sock = env.paths.socket(cid)
    mode = sock.parent.stat().st_mode & 0o777
    sock.parent.chmod(0o711)
    sock.chmod(0o777)
    typed = base64.b64encode(b"hunter2\n").decode()

    def intrude() -> bytes:
        c = socket.socket(socket.AF_UNIX)
        c.settimeout(5)
        try:
            c.connect(sock.name)
            c.sendall(json.dumps(owner_link.Write(data=typed)).encode() + b"\n")
            return c.recv(65536)
        except (BrokenPipeError, ConnectionResetError):
            return b""  # closed on us: the same refusal as an empty read
        except OSError as e:
            return f"error {e}".encode()
        finally:
            c.close()

    try:
        answer = await anyio.to_thread.run_sync(as_nobody, intrude, sock.parent)
    finally:
        sock.parent.chmod(mode)
    assert answer == b"", answer  # closed without a word
    assert "command.input_written" not in await env.types(store, cid)
    assert b"hunter2" not in env.output(cid)
    # the owner still serves us
    assert (
        await service.command_request(store, env.paths, cid, owner_link.Kill())
        == 'Command "sleeper" killed (SIGKILL).'
    )


def test_client_refuses_a_socket_served_by_another_user(tmp_path: Path) -> None:
    """A replaced socket: whoever listens on it is not us, so nothing (a password typed by `cmd write`) is sent."""
    path = tmp_path / "owner.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    received: list[bytes] = []
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child: listen as nobody, report what arrives
        try:
            os.close(r)
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            server.listen(1)
            os.write(w, b"L")
            server.settimeout(5)
            conn, _ = server.accept()
            conn.settimeout(2)
            try:
                os.write(w, conn.recv(65536) or b"-")
            except OSError:
                os.write(w, b"-")
        finally:
            os._exit(0)
    os.close(w)
    server.close()
    try:
        assert os.read(r, 1) == b"L"

        async def go() -> None:
            with pytest.raises(ForeignOwnerError, match="served by uid 65534"):
                await owner_link.connect_owner(path)

        anyio.run(go)
        received.append(os.read(r, 65536))
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    assert received == [b"-"]  # the fake owner got nothing


def test_check_private_accepts_our_own_0700_dir(tmp_path: Path) -> None:
    d = tmp_path / "mine"
    d.mkdir(mode=0o700)
    assert check_private(d) == d
    # a store without commands/ yet (a fresh import): asking for a socket path is not an error
    paths = CommandPaths(f"sqlite:{tmp_path / 's' / 'ev.db'}")
    assert paths.socket("c1") == paths.root / "c1.sock"
    paths.ensure()
    paths.root.chmod(0o770)
    with pytest.raises(UnsafeDirectoryError, match="others can write it"):
        paths.socket("c1")
