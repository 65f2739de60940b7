"""The dashboard in a real terminal: tmux runs ``loopd-es dash``; another process changes the log; the screen
follows; a key press pauses a goal and the event is in the log."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.components import require

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def tmux_or_skip() -> str:
    found = shutil.which("tmux")
    require(found, "tmux", ".ci/run installs it: apt-get install tmux")
    assert found is not None
    return found


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[tuple[str, Path, dict[str, str]]]:
    tmux = tmux_or_skip()
    session = f"loopd-dash-{uuid.uuid4().hex[:8]}"
    store = f"sqlite:{tmp_path / '.loopd' / 'events.db'}"
    env = {**os.environ, "LOOPD_ES_STORE": store, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    env.pop("LOOPD_ES_HOST", None)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "loopd_es.cli",
            "goal",
            "create",
            "first",
            "--objective",
            "One",
            "--read-only",
        ],
        cwd=tmp_path,
        env=env,
        check=True,
        capture_output=True,
    )
    command = f"cd {tmp_path} && LOOPD_ES_STORE={store} PYTHONPATH={env['PYTHONPATH']} {sys.executable} -m loopd_es.cli dash"
    subprocess.run(
        [tmux, "new-session", "-d", "-s", session, "-x", "100", "-y", "30", command], check=True, env=env
    )
    try:
        yield session, tmp_path, env
    finally:
        subprocess.run([tmux, "kill-session", "-t", session], check=False, capture_output=True)


def screen(session: str) -> str:
    return subprocess.run(
        ["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True, check=True
    ).stdout


def until(check: Callable[[], bool], within: float = 30) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "the screen never showed it"
        time.sleep(0.1)


def test_the_screen_follows_the_log_and_a_key_pauses_a_goal(
    terminal: tuple[str, Path, dict[str, str]],
) -> None:
    session, cwd, env = terminal
    until(lambda: "first" in screen(session))
    # another process adds a goal: it shows without a key press
    subprocess.run(
        [
            sys.executable,
            "-m",
            "loopd_es.cli",
            "goal",
            "create",
            "second",
            "--objective",
            "Two",
            "--read-only",
        ],
        cwd=cwd,
        env=env,
        check=True,
        capture_output=True,
    )
    until(lambda: "second" in screen(session))
    rows = [line for line in screen(session).splitlines() if " second " in line or " first " in line]
    assert rows and "paused" not in "".join(rows)
    subprocess.run(["tmux", "send-keys", "-t", session, "p"], check=True)
    until(lambda: "paused" in screen(session))
    log = subprocess.run(
        [sys.executable, "-m", "loopd_es.cli", "read", "--json"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert '"type":"goal.paused"' in log.replace(" ", "")
    subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
