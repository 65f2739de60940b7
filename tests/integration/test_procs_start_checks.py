"""What ``exec`` cannot take is refused before a command is recorded, and a child whose exec fails never runs
on as a copy of its owner (docs/reference/loopd.md#s3-17: every start check comes before spawning)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest

from loopd_es.cli.main import main
from loopd_es.errors import EXIT_USAGE
from loopd_es.log import open_store
from loopd_es.procs.pty import PtyChild
from tests.waits import wait_until

from .test_procs_support import Env, env

if TYPE_CHECKING:
    from loopd_es.domain.command import CommandState

__all__ = ["env"]


@pytest.mark.parametrize("environment", [{"A=B": "x"}, {"": "x"}, {"A\0B": "x"}, {"A": "x\0y"}])
def test_a_child_whose_exec_fails_ends_and_the_owner_hears_why(environment: dict[str, str]) -> None:
    """``ValueError`` from ``execve`` escaped in the forked child: the child ran on as a second owner and its
    traceback became the command's output. Now the spawn fails in the parent, with one line, and no copy runs."""
    with pytest.raises(OSError, match="cannot exec") as caught:
        PtyChild.spawn(["/bin/true"], cwd="/", env=environment, cols=80, rows=24)
    assert "\n" not in str(caught.value)


def test_a_failed_exec_leaves_no_copy_of_the_parent_running(tmp_path: Path) -> None:
    """The parent of a failed spawn is the only one to go on: a forked copy would print a second line."""
    script = (
        "import os\n"
        "from loopd_es.procs.pty import PtyChild\n"
        "try:\n"
        "    PtyChild.spawn(['/bin/true'], cwd='/', env={'A=B': 'x'}, cols=80, rows=24)\n"
        "except Exception:\n"
        "    pass\n"
        "with open(os.environ['MARK'], 'a') as marker:\n"
        "    marker.write(f'{os.getpid()}\\n')\n"
    )
    mark = tmp_path / "mark"
    subprocess.run(
        [sys.executable, "-c", script], env={**os.environ, "MARK": str(mark)}, check=True, timeout=60
    )
    assert len(mark.read_text().split()) == 1, mark.read_text()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--env", "A=x\0y", "--", "true"), "Invalid env value for 'A'"),
        (("--", "true", "a\0b"), "Invalid argument 'a\\x00b'"),
        (("--timeout", "9999999999999", "--", "true"), "timeoutSeconds must be at most 315360000"),
        (("--timeout", "99999999999999999999", "--", "true"), "timeoutSeconds must be at most 315360000"),
        (("--timeout", "315360001", "--", "true"), "timeoutSeconds must be at most 315360000"),
    ],
)
def test_cli_start_refuses_what_cannot_run_with_one_line(
    env: Env, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str
) -> None:
    assert main("--store", env.url, "cmd", "start", *argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert main("--store", env.url, "cmd", "list") == 0
    assert capsys.readouterr().out == ""  # nothing recorded


def test_cli_await_names_the_goal_and_takes_a_prefix(
    env: Env, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cmd await ID --goal <uuid>`` answered ``Goal "<uuid>" now awaits ...``; the reference (and the tool)
    name the goal by its name. ``--goal`` now takes a unique prefix, as the other goal commands do."""
    monkeypatch.chdir(env.tmp)  # the simulated host keeps its state in the working directory
    assert main("--store", env.url, "goal", "create", "docs", "--objective", "Write the guide") == 0
    goal_id = capsys.readouterr().out.split()[0]
    assert (
        main("--store", env.url, "cmd", "start", "--title", "build", "--goal", goal_id[:8], "--", "cat") == 0
    )
    cid = capsys.readouterr().out.strip()
    assert main("--store", env.url, "cmd", "await", cid, "--goal", goal_id[:8]) == 0
    assert capsys.readouterr().out.strip() == 'Goal "docs" now awaits "build" (fires once on exit).'
    assert main("--store", env.url, "cmd", "show", cid) == 0
    assert f'"goal_id": "{goal_id}"' in capsys.readouterr().out
    assert main("--store", env.url, "cmd", "terminate", cid, "--remove") == 0


SLEEPER = "import time\nprint('ready', flush=True)\ntime.sleep(60)\n"


def test_cli_restart_starts_the_spec_again_as_a_new_command(
    env: Env, capsys: pytest.CaptureFixture[str]
) -> None:
    """Reference restart: stop it if it runs, start a new command (new id, the old record kept) with the same
    spec; env values were never recorded, and the answer says which keys are lost."""
    from loopd_es.procs import service

    from .test_procs_support import PY

    argv = (
        "--title",
        "srv",
        "--env",
        "TOKEN=s3cr3t",
        "--watch-until",
        "READY",
        "--timeout",
        "600",
        "--cols",
        "90",
    )
    assert main("--store", env.url, "cmd", "start", *argv, "--", PY, "-c", SLEEPER) == 0
    old = capsys.readouterr().out.strip()
    assert main("--store", env.url, "cmd", "restart", old[:8]) == 0
    out, err = capsys.readouterr()
    new = out.strip()
    assert new != old and err.strip() == (
        f'Command "srv" restarted as {new[:8]}... (env TOKEN NOT restored — values are never persisted)'
    )

    async def states() -> tuple[CommandState | None, CommandState | None]:
        async with await open_store(env.url) as store:
            return await service.load_state(store, old), await service.load_state(store, new)

    before, after = anyio.run(states)
    assert before is not None and after is not None
    assert (before.status, before.end_reason, before.removed) == ("terminated", "terminate", False)
    assert after.running and after.env_keys == ()
    same = ("title", "command", "args", "cwd", "shell", "watch", "timeout_seconds", "cols", "rows", "goal_id")
    assert {k: getattr(after, k) for k in same} == {k: getattr(before, k) for k in same}
    assert main("--store", env.url, "cmd", "terminate", new) == 0
    capsys.readouterr()
    # an ended command restarts without a stop, and says nothing of env when it had none
    assert main("--store", env.url, "cmd", "start", "--title", "once", "--", "true") == 0
    once = capsys.readouterr().out.strip()
    wait_until("the command's exit", lambda: anyio.run(_status, env.url, once), done=lambda s: s != "running")
    assert main("--store", env.url, "cmd", "restart", once) == 0
    out, err = capsys.readouterr()
    assert err.strip() == f'Command "once" restarted as {out.strip()[:8]}...'
    assert main("--store", env.url, "cmd", "restart", "nosuch") == EXIT_USAGE
    assert "Command not found." in capsys.readouterr().err


async def _status(url: str, cid: str) -> str:
    from loopd_es.procs import service

    async with await open_store(url) as store:
        state = await service.load_state(store, cid)
    return "gone" if state is None else state.status
