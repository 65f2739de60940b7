"""The dashboard in a real terminal: tmux runs ``loopd-es dash``; another process changes the log; the screen
follows; a key press pauses a goal and the event is in the log."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.components import require
from tests.waits import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def tmux_or_skip() -> str:
    found = shutil.which("tmux")
    require(found, "tmux", ".ci/run installs it: apt-get install tmux")
    assert found is not None
    return found


@pytest.fixture(params=[(100, 30)])
def terminal(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[str, Path, dict[str, str]]]:
    """``loopd-es dash`` in a tmux session of ``request.param`` (columns, rows), on a log with one goal."""
    columns, rows = request.param
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
        [tmux, "new-session", "-d", "-s", session, "-x", str(columns), "-y", str(rows), command],
        check=True,
        env=env,
    )
    try:
        yield session, tmp_path, env
    finally:
        subprocess.run([tmux, "kill-session", "-t", session], check=False, capture_output=True)


def screen(session: str) -> str:
    return subprocess.run(
        ["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True, check=True
    ).stdout


def until(session: str, check: Callable[[str], bool], what: str) -> str:
    """The screen once ``check`` holds for it (the last screen in the failure otherwise)."""
    return wait_until(f"the screen to show {what}", lambda: screen(session), done=check)


def test_the_screen_follows_the_log_and_a_key_pauses_a_goal(
    terminal: tuple[str, Path, dict[str, str]],
) -> None:
    session, cwd, env = terminal
    until(session, lambda s: "first" in s, "first")
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
    until(session, lambda s: "second" in s, "second")
    rows = [line for line in screen(session).splitlines() if " second " in line or " first " in line]
    assert rows and "paused" not in "".join(rows)
    subprocess.run(["tmux", "send-keys", "-t", session, "p"], check=True)
    until(session, lambda s: "paused" in s, "paused")
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


@pytest.mark.parametrize("terminal", [(80, 24)], indirect=True)
def test_at_80x24_the_cost_shows_and_tab_changes_tabs(terminal: tuple[str, Path, dict[str, str]]) -> None:
    session, _, _ = terminal
    shown = until(session, lambda s: "first" in s and "$0.0000" in s, "the goal with its cost")
    header = next(line for line in shown.splitlines() if " name " in line)
    assert "cost" in header and len(header.rstrip()) <= 80, shown
    subprocess.run(["tmux", "send-keys", "-t", session, "Tab"], check=True)
    until(session, lambda s: " title " in s and "$0.0000" not in s, "the commands tab")
    subprocess.run(["tmux", "send-keys", "-t", session, "BTab"], check=True)  # Shift-Tab
    until(session, lambda s: "$0.0000" in s, "the goals tab again")
    subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)


def test_the_arrows_select_a_goal_from_the_start(terminal: tuple[str, Path, dict[str, str]]) -> None:
    # the focus once started on the tab bar: Down did nothing and `p` paused the first goal
    session, cwd, env = terminal
    subprocess.run(
        [sys.executable, "-m", "loopd_es.cli", "goal", "create", "second", "--objective", "Two", "--read-only"],
        cwd=cwd, env=env, check=True, capture_output=True,
    )  # fmt: skip

    def rows(text: str) -> list[str]:  # the goal table's rows (the detail pane names a goal too)
        return [line for line in text.splitlines() if "/50" in line and "│" not in line]

    shown = until(session, lambda s: len(rows(s)) == 2, "both goals")
    second_row = rows(shown)[1]
    subprocess.run(["tmux", "send-keys", "-t", session, "Down"], check=True)
    subprocess.run(["tmux", "send-keys", "-t", session, "p"], check=True)
    shown = until(session, lambda s: any("paused" in line for line in rows(s)), "a paused goal")
    paused = [line.split()[0] for line in rows(shown) if "paused" in line]
    assert paused == [second_row.split()[0]], shown
    subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)


def test_a_crash_inside_the_screen_exits_1_not_0(tmp_path: Path) -> None:
    tmux = tmux_or_skip()
    session = f"loopd-dash-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "LOOPD_ES_STORE": f"sqlite:{tmp_path / 'events.db'}"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    subprocess.run([sys.executable, "-m", "loopd_es.cli", "goal", "create", "g", "--objective", "o", "--read-only"],
                   cwd=tmp_path, env=env, check=True, capture_output=True)  # fmt: skip
    crashing = (
        "import loopd_es.dash.app as a\n"
        "def boom(self): raise RuntimeError('boom')\n"
        "a.Dashboard.action_help = boom\n"
        "from loopd_es.cli.main import main\n"
        "raise SystemExit(main('dash'))\n"
    )
    (tmp_path / "crash.py").write_text(crashing)
    status = tmp_path / "status"
    command = (
        f"cd {tmp_path} && LOOPD_ES_STORE={env['LOOPD_ES_STORE']} PYTHONPATH={env['PYTHONPATH']} "
        f"{sys.executable} crash.py; echo $? > {status}; cat > /dev/null"  # the pane stays: its last words
    )
    subprocess.run(
        [tmux, "new-session", "-d", "-s", session, "-x", "100", "-y", "30", command], env=env, check=True
    )
    try:
        until(session, lambda s: "loopd-es" in s, "the dashboard")
        subprocess.run([tmux, "send-keys", "-t", session, "?"], check=True)
        code = wait_until("the dashboard to exit", lambda: status.read_text() if status.exists() else "",
                          done=lambda text: text.endswith("\n"))  # fmt: skip
        assert code.strip() == "1"
        until(session, lambda s: "loopd-es: the dashboard stopped on an internal error" in s, "the one line")
    finally:
        subprocess.run([tmux, "kill-session", "-t", session], check=False, capture_output=True)
