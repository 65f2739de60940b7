"""Shared helpers for the real-PTY command tests: a store per test, the CLI in-process, no leaked children."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest

from loopd_es.cli import cmd_cmds
from loopd_es.errors import LoopdError
from loopd_es.log import open_store
from loopd_es.procs import service
from loopd_es.procs.paths import CommandPaths
from tests.waits import await_until

if TYPE_CHECKING:
    from loopd_es.domain.command import CommandState
    from loopd_es.log.base import LogStore

PY = sys.executable


class Env:
    """One test's store URL, its command files, and every process to kill afterwards."""

    def __init__(self, tmp: Path) -> None:
        self.url = f"sqlite:{tmp / 'ev.db'}"
        self.paths = CommandPaths(self.url)
        self.tmp = tmp
        self.pids: set[int] = set()

    def script(self, name: str, body: str) -> str:
        path = self.tmp / f"{name}.py"
        path.write_text(body)
        return str(path)

    def output(self, cid: str) -> bytes:
        path = self.paths.log(cid)
        return path.read_bytes() if path.exists() else b""

    async def start(self, store: LogStore, *args: str, **kw: object) -> str:
        spec = service.StartSpec(title=str(kw.pop("title", "dev")), command=PY, args=list(args), **kw)  # type: ignore[arg-type]
        cid, pid = await service.start_command(store, self.url, spec)
        self.pids.add(pid)
        return cid

    async def state(self, store: LogStore, cid: str) -> CommandState:
        s = await service.load_state(store, cid)
        assert s is not None
        if s.supervisor_pid:
            self.pids.add(s.supervisor_pid)
        if s.pid:
            self.pids.add(s.pid)
        return s

    async def until(
        self, store: LogStore, cid: str, check: Callable[[CommandState], bool], within: float = 30
    ) -> CommandState:
        """The command's state once ``check`` holds for it (its last state in the failure otherwise)."""
        return await await_until(
            f"command {cid}'s state to pass {getattr(check, '__name__', 'the check')}",
            lambda: self.state(store, cid),
            done=check,
            within=within,
        )

    async def types(self, store: LogStore, cid: str) -> list[str]:
        return [e.type async for e in store.read_stream(f"command-{cid}")]

    def kill_all(self) -> None:
        for pid in self.pids:
            for kill in (os.killpg, os.kill):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    kill(pid, signal.SIGKILL)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path)
    try:
        yield e
    finally:
        e.kill_all()


@pytest.fixture
async def store(env: Env) -> AsyncIterator[LogStore]:
    s = await open_store(env.url)
    try:
        yield s
    finally:
        async with await open_store(env.url) as s2:  # collect pids recorded by owners
            for st in await service.list_states(s2):
                env.pids.update(p for p in (st.pid, st.supervisor_pid) if p)
        await s.aclose()


def run_cli(url: str, *argv: str) -> int:
    """``loopd-es --store URL cmd ...`` in-process (sync: the CLI runs its own event loop)."""
    parser = argparse.ArgumentParser(prog="loopd-es")
    parser.add_argument("--store")
    sub = parser.add_subparsers()
    cmd_cmds.register(sub)
    args = parser.parse_args(["--store", url, "cmd", *argv])
    try:
        code: int = anyio.run(args.handler, args)
    except LoopdError as e:
        print(f"loopd-es: {e}", file=sys.stderr)
        return e.exit_code
    return code
