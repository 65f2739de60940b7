"""Real processes in real PTYs: exit, terminate, kill, interrupt, timeout, shell, env, write
(docs/reference/loopd.md#s7-g S65-S69)."""

from __future__ import annotations

import base64
import os
import re
import signal
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import msgspec
import pytest
from anyio.abc import SocketAttribute
from anyio.streams.buffered import BufferedByteReceiveStream

from loopd_es.domain.command import CommandStateError
from loopd_es.errors import UsageError
from loopd_es.log import open_store
from loopd_es.procs import owner_link, service
from tests.waits import scaled_timeout, wait_until

from .test_procs_support import PY, Env, env, run_cli, store

if TYPE_CHECKING:
    from loopd_es.log.base import LogStore

pytestmark = pytest.mark.anyio
__all__ = ["env", "store"]

SLEEPER = "import time\nprint('ready', flush=True)\ntime.sleep(60)\n"


async def test_natural_exit_zero_records_output_and_pid(env: Env, store: LogStore) -> None:
    # the child exits only once it is written to: start returning first shows it never waits for the child
    cid = await env.start(store, "-c", "input()\nprint('hello from pty')")
    assert (await env.state(store, cid)).running
    await env.until(store, cid, lambda s: s.pid is not None)
    await service.command_request(
        store, env.paths, cid, owner_link.Write(data=base64.b64encode(b"go\n").decode())
    )
    s = await env.until(store, cid, lambda s: not s.running)
    assert (s.status, s.end_reason, s.exit_code) == ("exited", "exit", 0)
    assert s.pid and s.stream_bytes > 0
    assert b"hello from pty" in env.paths.log(cid).read_bytes()
    assert (await env.types(store, cid))[:2] == ["command.started", "command.spawned"]


async def test_terminate_then_kill_and_a_trapping_child(env: Env, store: LogStore) -> None:
    cid = await env.start(store, "-c", SLEEPER, title="sleeper")
    await env.until(store, cid, lambda s: b"ready" in env.output(cid))
    msg = await service.command_request(store, env.paths, cid, owner_link.Terminate())
    assert msg == 'Command "sleeper" terminated.'
    s = await env.state(store, cid)
    assert (s.status, s.end_reason, s.signal, s.exit_code) == ("terminated", "terminate", "SIGTERM", 143)

    trap = env.script(
        "trap",
        "import signal, time\nsignal.signal(signal.SIGTERM, lambda *a: print('trapped', flush=True))\n"
        "print('ready', flush=True)\nwhile True: time.sleep(1)\n",
    )
    cid = await env.start(store, trap, title="trap")
    await env.until(store, cid, lambda s: b"ready" in env.output(cid))
    t0 = time.monotonic()
    await service.command_request(store, env.paths, cid, owner_link.Terminate())
    assert time.monotonic() - t0 > 2.8  # the 3 s grace, then SIGKILL (a slow machine only makes it longer)
    s = await env.state(store, cid)
    assert (s.status, s.end_reason, s.signal) == ("terminated", "terminate", "SIGKILL")
    assert b"trapped" in env.paths.log(cid).read_bytes()


async def test_kill_and_interrupt(env: Env, store: LogStore) -> None:
    cid = await env.start(store, "-c", SLEEPER, title="k")
    assert (
        await service.command_request(store, env.paths, cid, owner_link.Kill())
        == 'Command "k" killed (SIGKILL).'
    )
    s = await env.state(store, cid)
    assert (s.status, s.end_reason, s.signal, s.exit_code) == ("terminated", "terminate", "SIGKILL", 137)
    with pytest.raises(CommandStateError, match="^Command is terminated; nothing to kill.$"):
        await service.command_request(store, env.paths, cid, owner_link.Kill())

    cid = await env.start(store, "-c", SLEEPER, title="i")
    await env.until(store, cid, lambda s: b"ready" in env.output(cid))
    msg = await service.command_request(store, env.paths, cid, owner_link.Interrupt())
    assert msg == 'SIGINT delivered to "i" (process may continue if it traps the signal).'
    s = await env.until(store, cid, lambda s: not s.running)
    assert (s.status, s.end_reason, s.signal) == ("exited", "exit", "SIGINT")


async def test_a_child_meets_default_signal_actions_whatever_its_owner_ignores(
    env: Env, store: LogStore
) -> None:
    """An owner started as a shell's background job ignores SIGINT (and Python ignores SIGPIPE): a child that
    inherited that would outlive ``interrupt``, as test_kill_and_interrupt once saw when run that way."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        spec = service.StartSpec(title="sig", command="grep", args=["SigIgn", "/proc/self/status"])
        cid, pid = await service.start_command(store, env.url, spec)
    finally:
        signal.signal(signal.SIGINT, previous)
    env.pids.add(pid)
    await env.until(store, cid, lambda s: not s.running)
    found = re.search(rb"SigIgn:\s*([0-9a-f]+)", env.output(cid))
    assert found, env.output(cid)
    ignored = int(found[1], 16)
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGPIPE, signal.SIGXFSZ):
        assert not ignored & (1 << (sig - 1)), f"the child ignores {sig.name}"


async def test_timeout_terminates_with_end_reason_timeout(env: Env, store: LogStore) -> None:
    cid = await env.start(store, "-c", SLEEPER, timeout_seconds=1)
    s = await env.until(store, cid, lambda s: not s.running, within=45)  # the sleeper alone would take 60 s
    assert (s.status, s.end_reason) == ("terminated", "timeout") and s.ended_at and s.deadline_at
    assert s.ended_at >= s.deadline_at
    assert s.last_error and "timed out after 1s" in s.last_error
    assert (await env.types(store, cid)).count("command.exited") == 1


async def test_shell_quoting_and_env_values_never_logged(env: Env, store: LogStore) -> None:
    spec = service.StartSpec(title="sh", command="echo", args=["hi there", "a|b", "it's"], shell=True)
    cid, pid = await service.start_command(store, env.url, spec)
    env.pids.add(pid)
    s = await env.until(store, cid, lambda s: not s.running)
    assert (s.command, s.args, s.shell) == ("echo", ("hi there", "a|b", "it's"), True)
    assert b"hi there a|b it's" in env.paths.log(cid).read_bytes()

    cid = await env.start(
        store,
        "-c",
        "import os; print(os.environ['SECRET_TOKEN'], os.environ['PLAIN'])",
        env={"SECRET_TOKEN": "s3cr3t-value", "PLAIN": "yes"},
    )
    s = await env.until(store, cid, lambda s: not s.running)
    assert s.env_keys == ("PLAIN", "SECRET_TOKEN")
    assert b"s3cr3t-value yes" in env.paths.log(cid).read_bytes()
    db = (env.tmp / "ev.db").read_bytes() + b"".join(p.read_bytes() for p in env.tmp.glob("ev.db*"))
    assert b"s3cr3t-value" not in db and b"SECRET_TOKEN" in db


async def test_write_resize_and_attach(env: Env, store: LogStore) -> None:
    body = (
        "import os, sys\nprint('ready', flush=True)\nfor line in sys.stdin:\n"
        "    print('got', line.strip(), os.get_terminal_size().columns, flush=True)\n"
    )
    cid = await env.start(store, "-c", body, title="repl")
    assert await service.command_request(store, env.paths, cid, owner_link.Resize(cols=120, rows=40)) == (
        'Terminal resized to 120x40 for "repl".'
    )
    import base64

    data = base64.b64encode(b"abc\n").decode()
    assert await service.command_request(store, env.paths, cid, owner_link.Write(data=data)) == (
        'Sent 4 byte(s) to "repl".'
    )
    await env.until(store, cid, lambda s: b"got abc 120" in env.output(cid))
    stream = await anyio.connect_unix(env.paths.socket(cid))
    async with stream:
        await stream.send(b'{"op": "attach"}\n')
        seen = b""
        with anyio.fail_after(scaled_timeout(5)):
            while b"attached" not in seen:
                seen += await stream.receive()
            await stream.send(b"xyz\n")
            while b"got xyz" not in seen:
                seen += await stream.receive()
    with pytest.raises(UsageError, match="Invalid size 0x5"):
        await service.command_request(store, env.paths, cid, owner_link.Resize(cols=0, rows=5))
    await service.command_request(store, env.paths, cid, owner_link.Terminate())
    assert "command.input-written" in await env.types(store, cid)
    assert "command.resized" in await env.types(store, cid)


@pytest.mark.parametrize(("cols", "rows"), [(-1, 24), (80, 0), (80, 65_536), (1 << 40, 24)])
async def test_a_start_with_a_size_no_terminal_has_is_refused_and_records_nothing(
    env: Env, store: LogStore, cols: int, rows: int
) -> None:
    """``cmd start --cols -1`` was accepted, and its owner then failed to make the terminal: a ``missing``
    command. The size is checked as ``resize`` checks it, before anything is recorded or spawned."""
    spec = service.StartSpec(title="t", command="true", cols=cols, rows=rows)
    with pytest.raises(UsageError, match=f"Invalid size {cols}x{rows}"):
        await service.start_command(store, env.url, spec)
    assert await store.head() == 0


async def test_a_client_leaving_an_attach_while_output_flows_leaves_the_command_running(
    env: Env, store: LogStore
) -> None:
    """The owner forwards output to an attached client; one that leaves (Ctrl-C in ``cmd attach``) while output
    is on its way made the owner's next send fail, and that error took the owner and its command down."""
    chatty = "import itertools, time\nfor n in itertools.count():\n    print('line', n, flush=True)\n    time.sleep(0.005)\n"
    cid = await env.start(store, "-c", chatty, title="chatty")
    await env.until(store, cid, lambda s: env.paths.socket(cid).exists() and b"line 3" in env.output(cid))
    stream = await anyio.connect_unix(env.paths.socket(cid))
    async with stream:
        await stream.send(b'{"op": "attach"}\n')
        seen = b""
        with anyio.fail_after(scaled_timeout(5)):
            while seen.count(b"line") < 3:
                seen += await stream.receive()
        # the client stops reading (its connection still open, so the owner sees no end of input): the owner's
        # next send fails at once, as it does when a client's close races the output
        stream.extra(SocketAttribute.raw_socket).shutdown(socket.SHUT_RD)
        before = len(env.output(cid))
        await env.until(store, cid, lambda s: len(env.output(cid)) > before + 2000)
        answer = await owner_link.owner_request(env.paths, cid, owner_link.Status())
        assert answer is not None and answer.ok and answer.message == "running", answer
        assert (await env.state(store, cid)).running
    assert await service.command_request(store, env.paths, cid, owner_link.Terminate()) == (
        'Command "chatty" terminated.'
    )


def test_cli_remove_rules_and_pattern_read(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        run_cli(
            env.url,
            "start",
            "--title",
            "dev",
            "--",
            PY,
            "-c",
            "import time\nprint('\\x1b[31mERROR boom\\x1b[0m')\nprint('info fine', flush=True)\ntime.sleep(60)",
        )
        == 0
    )
    cid = capsys.readouterr().out.strip()
    wait_until("the command's output to show 'info fine'", lambda: b"info fine" in env.output(cid))
    assert run_cli(env.url, "remove", cid[:8]) == 3
    assert "is still running — terminate it first (terminate ≠ remove)." in capsys.readouterr().err
    assert run_cli(env.url, "read", cid, "--pattern", "ERROR", "--json") == 0
    out = capsys.readouterr().out
    assert '"total_matches": 1' in out and "\\u001b[31mERROR boom" in out and "info fine" not in out
    assert run_cli(env.url, "read", cid, "--pattern", "error") == 0 and capsys.readouterr().out.strip() == ""
    assert run_cli(env.url, "read", cid, "--pattern", "error", "--ignore-case") == 0
    assert "ERROR boom" in capsys.readouterr().out
    assert run_cli(env.url, "read", cid, "--pattern", "(a+)+") == 2
    assert "Potentially dangerous regex pattern rejected: '(a+)+'" in capsys.readouterr().err
    assert run_cli(env.url, "list") == 0 and "running" in capsys.readouterr().out
    assert run_cli(env.url, "terminate", "--remove", cid) == 0
    assert capsys.readouterr().out.strip() == 'Command "dev" terminated; removed.'
    assert not env.paths.log(cid).exists()
    assert run_cli(env.url, "show", cid) == 2 and "Command not found." in capsys.readouterr().err
    assert run_cli(env.url, "start", "--timeout", "0", "--", PY) == 2
    assert "timeoutSeconds must be a positive integer in seconds" in capsys.readouterr().err
    assert run_cli(env.url, "start", "--watch-filter", "(unclosed", "--", PY) == 2
    assert "Invalid watch filter" in capsys.readouterr().err
    assert os.listdir(env.paths.root) == [] or all(
        not n.endswith(".sock") for n in os.listdir(env.paths.root)
    )


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b'{"op": "resize", "cols": "80", "rows": 24}', "`$.cols`"),
        (b'{"op": "write", "data": 5}', "`$.data`"),
        (b'{"op": "watch", "until_action": "later"}', "`$.until_action`"),
        (b'{"op": "terminate", "remove": "yes"}', "`$.remove`"),
        (b'{"op": "terminate", "force": true}', "`force`"),
        (b'{"op": "format-disk"}', "`$.op`"),
        (b'{"cols": 80}', "`op`"),
        (b"[1, 2]", "Expected `object`, got `array`"),
    ],
)
async def test_the_owner_refuses_a_malformed_request_naming_the_field(
    env: Env, store: LogStore, raw: bytes, field: str
) -> None:
    """The owner-socket protocol is a tagged union of Structs: nothing is coerced, nothing reaches the child."""
    cid = await env.start(store, "-c", SLEEPER, title="sleeper")
    await env.until(store, cid, lambda s: b"ready" in env.output(cid))
    before = await env.state(store, cid)
    async with await owner_link.connect_owner(env.paths.socket(cid)) as stream:
        await stream.send(raw + b"\n")
        with anyio.fail_after(scaled_timeout(10)):
            line = await BufferedByteReceiveStream(stream).receive_until(b"\n", 1 << 16)
    answer = msgspec.json.decode(line, type=owner_link.OwnerAnswer)
    assert (answer.ok, answer.code) == (False, 2) and field in answer.message, answer
    after = await env.state(store, cid)
    assert after.running and (after.cols, after.rows, after.input_bytes) == (
        before.cols,
        before.rows,
        before.input_bytes,
    )
    await service.command_request(store, env.paths, cid, owner_link.Terminate())


@pytest.mark.parametrize("action", ["start", "await"])
def test_a_command_bound_to_a_goal_that_does_not_exist_is_refused(
    env: Env, capsys: pytest.CaptureFixture[str], action: str
) -> None:
    """``cmd await C --goal nosuch`` said the goal now awaits and recorded it; ``cmd start --goal nosuch`` bound a
    command to nobody. Both say the goal is not found (exit 2) and record nothing."""
    from loopd_es.cli.main import main

    url = env.url
    assert main("--store", url, "cmd", "start", "--", "true") == 0
    cid = capsys.readouterr().out.strip()
    before = _events(url)
    argv = (
        ("cmd", "await", cid, "--goal", "nosuch")
        if action == "await"
        else ("cmd", "start", "--goal", "nosuch", "--", "true")
    )
    assert main("--store", url, *argv) == 2
    assert "Goal not found" in capsys.readouterr().err
    assert _events(url) == before


def _events(url: str) -> list[str]:
    async def read() -> list[str]:
        async with await open_store(url) as store:
            return [f"{e.stream} {e.type}" async for e in store.read_all()]

    return anyio.run(read)


def test_attach_with_stdin_from_a_file_or_dev_null_detaches_cleanly(
    env: Env, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """epoll refuses a regular file and /dev/null: ``cmd attach ID < /dev/null`` was "internal error:
    ExceptionGroup" (exit 1). Such a stdin is read as it is: its bytes go to the command, its end detaches."""
    import subprocess
    import sys

    from loopd_es.cli.main import main

    assert main("--store", env.url, "cmd", "start", "--", PY, "-c", SLEEPER) == 0
    cid = capsys.readouterr().out.strip()
    typed = tmp_path / "keys.txt"
    typed.write_bytes(b"print('typed')\n")

    def owner_live() -> bool:  # attach needs the owner's socket, up a moment after `cmd start` returns
        assert main("--store", env.url, "cmd", "show", cid) == 0
        return '"live"' in capsys.readouterr().out

    wait_until("the command's owner to answer", owner_live)
    try:
        for source in (os.devnull, str(typed)):
            with open(source, "rb") as stdin:
                done = subprocess.run(
                    [sys.executable, "-m", "loopd_es", "--store", env.url, "cmd", "attach", cid],
                    stdin=stdin, capture_output=True, text=True, timeout=scaled_timeout(60),
                )  # fmt: skip
            assert done.returncode == 0 and "[detached]" in done.stderr, done.stderr
            assert "internal error" not in done.stderr
    finally:
        assert main("--store", env.url, "cmd", "kill", cid) == 0


def test_input_to_a_command_whose_owner_died_records_nothing(
    env: Env, capsys: pytest.CaptureFixture[str]
) -> None:
    """As the reference: no live handle, so "reconcile marks it honestly", and the failed write appends
    nothing (it used to append the command's ``missing`` exit itself)."""
    import json

    from loopd_es.cli.main import main

    assert main("--store", env.url, "cmd", "start", "--", PY, "-c", SLEEPER) == 0
    cid = capsys.readouterr().out.strip()

    def owner_pid() -> int:
        assert main("--store", env.url, "cmd", "show", cid) == 0  # JSON already
        return int(json.loads(capsys.readouterr().out)["supervisor_pid"] or 0)

    owner = wait_until("the owner's pid on record", owner_pid)
    os.kill(owner, signal.SIGKILL)
    wait_until("the owner's end", lambda: not os.path.exists(f"/proc/{owner}") or _zombie(owner))
    before = _events(env.url)
    for action in (("write", cid, "x"), ("interrupt", cid)):
        assert main("--store", env.url, "cmd", *action) == 3
        assert "live handle" in capsys.readouterr().err
    assert _events(env.url) == before
    assert main("--store", env.url, "cmd", "reconcile") == 0  # whose job it is
    assert len(_events(env.url)) > len(before)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_read_and_start_arguments_out_of_range_are_usage_errors(
    env: Env, capsys: pytest.CaptureFixture[str]
) -> None:
    """``cmd read --limit -1`` and ``--offset -1`` answered exit 0 with odd slices; ``cmd start -- ''`` said
    the title was missing."""
    from loopd_es.cli.main import main

    assert main("--store", env.url, "cmd", "start", "--", "true") == 0
    cid = capsys.readouterr().out.strip()
    for bad in (("--limit", "-1"), ("--limit", "0"), ("--offset", "-1")):
        assert main("--store", env.url, "cmd", "read", cid, *bad) == 2
        assert f"argument {bad[0]}" in capsys.readouterr().err
    assert main("--store", env.url, "cmd", "start", "--", "") == 2
    assert "command is required" in capsys.readouterr().err


def test_a_suspended_watch_counts_every_line_it_drops(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    """Reference: a suspended or exhausted watch counts every further non-blank line in droppedLines. The count
    stopped at the suspension (101 of 2000 flooded lines); every matching line is now pushed or counted."""
    import json

    from loopd_es.cli.main import main

    flood = "for i in range(2000): print('L%d' % i, flush=True)"
    assert main("--store", env.url, "cmd", "start", "--watch-filter", "L", "--", PY, "-c", flood) == 0
    cid = capsys.readouterr().out.strip()

    def ended() -> dict[str, object] | None:
        assert main("--store", env.url, "cmd", "show", cid) == 0
        record: dict[str, object] = json.loads(capsys.readouterr().out)
        return record if record["status"] != "running" else None

    record = wait_until("the command's exit", ended, within=60)
    assert (
        record is not None and record["watch_state"] == "flood-suspended"
    )  # 2000 lines at once: past 100 a second

    async def pushed() -> int:
        async with await open_store(env.url) as store:
            return sum([e.data_dict().get("lines", 0) async for e in store.read_stream(f"command-{cid}")
                        if e.type == "command.watch-matched"])  # fmt: skip

    assert record["watch_dropped_lines"] == 2000 - anyio.run(pushed)
