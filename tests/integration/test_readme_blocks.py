"""Everything a newcomer types works as written: every ``sh`` block of the README, top to bottom, in one shell.

The lines run one at a time in one bash in one empty directory, as a reader pasting them would: variables and
exports carry over from block to block, a line ending in ``&`` keeps running, and a line that says ``Ctrl-C``
gets SIGINT once it has started. Each line must exit with the code its comment promises (``# exit 3: ...``), else
0. A comment before a block (``<!-- readme-test: KIND ... -->``) says what it needs:

- ``skip``: not run here (it installs, runs the whole suite, or is a terminal program another test drives);
- ``opencode``: runs in a project of its own beside a real ``opencode serve`` on the tests' fake model (the
  block's port is swapped for a free one; blocks without the marker never see OpenCode);
- ``postgresql``: the block's server URL is swapped for the test server's.

Without OpenCode or PostgreSQL those blocks are skipped here (and fail under ``CI=true``, as every test that needs
a real component does).
"""

from __future__ import annotations

import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TypeVar

import pytest

from ..components import under_ci
from ..opencode.fake_llm import FakeLLM
from ..opencode.server import ENV as OPENCODE_ENV
from ..opencode.server import OpenCodeServer, free_port
from ..postgres_server import ENV as POSTGRES_ENV
from ..postgres_server import pg_url
from ..waits import LAST_INTERVAL, WaitTimeout, let_time_pass, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

__all__ = ["pg_url"]

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BLOCK = re.compile(r"(?:<!-- readme-test: (?P<kind>\w+)[^>]*-->\n)?```sh\n(?P<body>.*?)```", re.S)
PG_URL_IN_README = "postgresql://loopd@db.internal:5432/loopd?schema=team_a"
OPENCODE_PORT_IN_README = "4096"
KINDS = ("run", "skip", "opencode", "postgresql")


@dataclass(frozen=True)
class Block:
    kind: str
    line: int  # where the block starts in the README, for messages
    commands: tuple[str, ...]


def readme_blocks(text: str) -> list[Block]:
    """The README's ``sh`` blocks in order, each cut into commands (a trailing backslash joins lines)."""
    blocks = []
    for match in BLOCK.finditer(text):
        kind = match.group("kind") or "run"
        assert kind in KINDS, (
            f"README line {text[: match.start()].count(chr(10)) + 1}: unknown marker {kind!r}"
        )
        joined = match.group("body").replace("\\\n", " ")
        commands = tuple(line for line in joined.splitlines() if line.strip())
        blocks.append(Block(kind, text[: match.start()].count("\n") + 1, commands))
    return blocks


def expected_exit(command: str) -> int:
    """The exit code a command's comment promises (``# exit N: why``), else 0."""
    promised = re.search(r"#\s*exit (\d+)\b", command)
    return int(promised.group(1)) if promised else 0


def runs_until_ctrl_c(command: str) -> bool:
    return "Ctrl-C" in command and not command.split("#", 1)[0].rstrip().endswith("&")


class Shell:
    """One bash that evaluates commands one at a time and reports each one's exit code on a pipe.

    Commands come NUL-terminated on one pipe and exit codes go back on another, so stdin stays ``/dev/null``
    and a command that reads stdin cannot swallow the commands after it. Everything the shell and its
    background jobs start shares one process group, which :meth:`close` ends.
    """

    def __init__(self, cwd: Path, env: dict[str, str], log: Path) -> None:
        command_r, self._command_w = os.pipe()
        self._status_r, status_w = os.pipe()
        closed = f"{command_r}<&- {status_w}>&-"  # the commands themselves do not inherit the pipes
        driver = (
            f'while IFS= read -r -d "" __line <&{command_r}; do '
            f'eval "$__line" {closed}; printf "%s\\n" "$?" >&{status_w}; done'
        )
        self.log = log
        self.cwd = cwd
        with open(log, "ab") as out:
            self.process = subprocess.Popen(
                ["bash", "--noprofile", "--norc", "-c", driver],
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                pass_fds=(command_r, status_w),
                start_new_session=True,
            )
        os.close(command_r)
        os.close(status_w)
        self._pending = b""

    def run(self, command: str, timeout: float = 180.0) -> int:
        with open(self.log, "a") as out:
            out.write(f"$ {command}\n")
        os.write(self._command_w, command.encode() + b"\0")
        # the probe itself waits on the pipe, so the pause between probes stays short: an exit code is read as soon
        # as it comes (this runs for every README line)
        self._wait(
            f"the exit code of {command!r}", partial(self._answered, command), timeout, max_interval=0.01
        )
        status, self._pending = self._pending.split(b"\n", 1)
        return int(status)

    def _wait(
        self, what: str, probe: Callable[[], T], within: float, max_interval: float = LAST_INTERVAL
    ) -> T:
        """:func:`wait_until`, failing with the end of the shell's log (what the commands printed)."""
        try:
            return wait_until(what, probe, within=within, max_interval=max_interval)
        except WaitTimeout as e:
            raise AssertionError(f"{e}\n{self.tail()}") from None

    def _answered(self, command: str, wait: float = 0.1) -> bool:
        """Whether the shell has reported a command's exit code; waits up to ``wait`` seconds for the pipe."""
        if b"\n" not in self._pending:
            ready, _, _ = select.select([self._status_r], [], [], wait)
            if ready:
                chunk = os.read(self._status_r, 64)
                if not chunk:
                    raise AssertionError(f"the shell died running: {command}\n{self.tail()}")
                self._pending += chunk
        return b"\n" in self._pending

    def run_until_ctrl_c(
        self, command: str, cwd: Path, started_within: float = 60.0, silent_setup: float = 3.0
    ) -> int:
        """Start ``command`` as a job of its own (so SIGINT reaches it), interrupt it once it has started.

        It has started when it printed its first line; ``loop run`` prints nothing until it stops, so for a
        command that holds a file of the working directory open (the log) and stays silent, ``silent_setup``
        seconds after that count as started. One that does neither within ``started_within`` fails the test.
        Returns its exit code after the interrupt.
        """
        out = self.log.with_name(self.log.name + ".job")
        out.unlink(missing_ok=True)
        # a newline ends the command's comment; `set -m` gives the job its own process group, where SIGINT is
        # not ignored as it is for a background job of a shell without job control
        started = f"set -m; {{ {command}\n}} > {shlex.quote(str(out))} 2>&1 & __job=$!; set +m"
        assert self.run(started) == 0
        pid_file = self.log.with_name(self.log.name + ".pid")
        assert self.run(f"echo $__job > {shlex.quote(str(pid_file))}") == 0
        pid = int(pid_file.read_text())

        def begun() -> str:
            if out.exists() and out.stat().st_size > 0:
                return "printed"
            if not Path(f"/proc/{pid}").exists():
                return "stopped"  # by itself: the assertion below says so
            return "holds a file" if _holds_a_file_under(pid, cwd) else ""

        how = self._wait(f"{command!r} to print or open a file under {cwd}", begun, started_within)
        if how == "holds a file":
            # a command that prints nothing until it stops: its log is open; it sets up its own Ctrl-C handling
            # next (a command that prints says so by printing, and is waited for)
            let_time_pass(silent_setup, "a command silent until Ctrl-C sets up its own Ctrl-C handling")
        alive = Path(f"/proc/{pid}").exists()
        if alive:
            os.killpg(pid, signal.SIGINT)  # as Ctrl-C does: to the whole job
        status = self.run("wait $__job")
        with open(self.log, "a") as log:
            log.write(out.read_text(errors="replace") if out.exists() else "")
        assert alive, f"{command!r} stopped by itself before Ctrl-C (exit {status})\n{self.tail()}"
        return status

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def close(self) -> None:
        os.close(self._command_w)
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=15)
        os.close(self._status_r)


def _holds_a_file_under(pgid: int, directory: Path) -> bool:
    """Whether a process of group ``pgid`` has a regular file under ``directory`` open (the log, say)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if int((proc / "stat").read_text().rsplit(")", 1)[1].split()[2]) != pgid:
                continue
            targets = [os.readlink(fd) for fd in (proc / "fd").iterdir()]
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if any(t.startswith(f"{directory}/") and Path(t).is_file() for t in targets):
            return True
    return False


def _loopd_es_on_path(bin_dir: Path) -> None:
    """``loopd-es`` on PATH is this checkout's code, run by this interpreter."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    shim = bin_dir / "loopd-es"
    shim.write_text(
        f'#!/bin/sh\nPYTHONPATH={shlex.quote(str(ROOT))} exec {shlex.quote(sys.executable)} -m loopd_es "$@"\n'
    )
    shim.chmod(0o755)


def _base_env(bin_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPD_ES_") and k != "LOOPD_SESSION"}
    env["PATH"] = f"{bin_dir}:{env.get('PATH', '/usr/bin:/bin')}"
    return env


def _wait_healthy(url: str, within: float = 60.0) -> None:
    def healthy() -> bool:
        with urllib.request.urlopen(f"{url}/global/health", timeout=1) as reply:
            return bool(reply.status == 200)

    wait_until(f"OpenCode at {url} to answer healthy", healthy, within=within, ignoring=(OSError,))


def _missing(what: str, env: str) -> bool:
    """True (a skip here) when ``env`` is unset; under CI a missing component fails the test."""
    if os.environ.get(env):
        return False
    if under_ci():
        pytest.fail(f"{what} is needed by a README block: CI must run it ({env} is unset)", pytrace=False)
    return True


@pytest.fixture
def opencode(tmp_path: Path) -> Iterator[OpenCodeServer | None]:
    """An isolated OpenCode project (config, fake model) whose ``opencode serve`` the README block starts."""
    if _missing("OpenCode", OPENCODE_ENV):
        yield None
        return
    fake = FakeLLM().start()
    server = OpenCodeServer(tmp_path / "oc", fake)
    server.prepare()
    try:
        yield server
    finally:
        fake.stop()


def test_readme_blocks_parse() -> None:
    """The markers are known, and every promised exit code is one the CLI uses."""
    blocks = readme_blocks(README.read_text())
    assert len(blocks) > 10
    for block in blocks:
        for command in block.commands:
            assert expected_exit(command) in (0, 2, 3, 4), command


def test_every_readme_shell_block_runs_as_written(
    tmp_path: Path, opencode: OpenCodeServer | None, request: pytest.FixtureRequest
) -> None:
    bin_dir = tmp_path / "bin"
    _loopd_es_on_path(bin_dir)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    shells: dict[str, Shell] = {"run": Shell(scratch, _base_env(bin_dir), tmp_path / "shell.log")}
    port = str(free_port())
    if opencode is not None:
        opencode_bin = tmp_path / "opencode-bin"
        opencode_bin.mkdir()
        (opencode_bin / "opencode").symlink_to(opencode.install / "bin" / "opencode")
        runtime = Path(tempfile.mkdtemp(prefix="loopd-readme-"))  # a socket path must stay under 100 bytes
        request.addfinalizer(lambda: shutil.rmtree(runtime, ignore_errors=True))
        env = {**_base_env(bin_dir), **opencode.env(), "XDG_RUNTIME_DIR": str(runtime)}
        env["PATH"] = f"{bin_dir}:{opencode_bin}:{env['PATH']}"
        shells["opencode"] = Shell(opencode.project, env, tmp_path / "opencode-shell.log")
    postgres = None if _missing("PostgreSQL", POSTGRES_ENV) else request.getfixturevalue("pg_url")
    ran: list[str] = []
    try:
        for block in readme_blocks(README.read_text()):
            if block.kind == "skip":
                continue
            if block.kind == "postgresql" and postgres is None:
                continue
            shell = shells.get("opencode" if block.kind == "opencode" else "run")
            if shell is None:
                continue
            for command in block.commands:
                if block.kind == "postgresql":
                    command = command.replace(PG_URL_IN_README, str(postgres))
                if block.kind == "opencode":
                    command = command.replace(OPENCODE_PORT_IN_README, port)
                where = f"README line {block.line}: {command}"
                if runs_until_ctrl_c(command):
                    status = shell.run_until_ctrl_c(command, shell.cwd)
                    # stopped by Ctrl-C: cleanly (0), or by the interrupt itself before the command set up its
                    # own handling (130, as a shell reports it); anything else is a failure
                    assert status in (0, 130), f"{where}\nexit {status}\n{shell.tail()}"
                else:
                    status = shell.run(command)
                    assert status == expected_exit(command), f"{where}\nexit {status}\n{shell.tail()}"
                ran.append(command)
                served = re.search(r"opencode serve --port (\d+) &", command)
                if served:
                    _wait_healthy(f"http://127.0.0.1:{served.group(1)}")
    finally:
        for shell in shells.values():
            shell.close()
    assert any("goal create" in command for command in ran)
