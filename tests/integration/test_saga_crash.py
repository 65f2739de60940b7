"""kill -9 at every step of a combined identity switch, in a real child process, then restart and recover.

The child is ``loopd-es goal switch-identity`` itself with ``LOOPD_ES_CRASH_AT=K``: it SIGKILLs itself at its
K-th crash point (before and after each host call and each append). The simulated host keeps its live state in
a file, so after the kill another process (``loopd-es goal recover``) settles the saga, and the goal's recorded
identity must equal the host's live identity, with no prefix of the log ever showing a half switch.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from loopd_es.domain.evolve import evolve, initial
from loopd_es.domain.streams import goal_stream
from loopd_es.host.simulated import SimulatedHost
from loopd_es.log import open_store

pytestmark = pytest.mark.slow

OLD = ("openai/gpt-5", "build")
NEW = ("openai/gpt-5-mini", "plan")


def _cli(workdir: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPD_ES_CRASH")}
    full_env.update(
        LOOPD_ES_STORE=f"sqlite:{workdir / 'events.db'}",
        LOOPD_ES_HOST=f"sim:{workdir / 'host.json'}",
        **(env or {}),
    )
    return subprocess.run(
        [sys.executable, "-m", "loopd_es", *args],
        cwd=workdir,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=30,
    )


async def _check(workdir: Path, goal_id: str) -> tuple[str | None, str | None]:
    """Recorded == live, and every prefix of the goal stream shows a whole identity; returns the identity."""
    store = await open_store(f"sqlite:{workdir / 'events.db'}", create=False)
    try:
        state = initial(goal_id)
        async for envelope in store.read_stream(goal_stream(goal_id)):
            state = evolve(state, envelope)
            assert (state.config.model, state.config.agent) in (OLD, NEW), (
                f"half switch at v{envelope.version}"
            )
    finally:
        await store.aclose()
    host = SimulatedHost.from_file(workdir / "host.json")
    live = await host.session_identity(state.worker_session_id or "")
    assert state.switch_in_flight is None
    assert (state.config.model, state.config.agent) == (live.model, live.agent)
    return state.config.model, state.config.agent


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A log and a host with one idle interactive goal on the old identity."""
    root = tmp_path_factory.mktemp("template")
    created = _cli(
        root,
        "goal",
        "create",
        "crash",
        "--objective",
        "o",
        "--model",
        OLD[0],
        "--agent",
        OLD[1],
        "--interactive",
        "--read-only",
    )
    assert created.returncode == 0, created.stderr
    goal_id = created.stdout.splitlines()[0]
    replied = _cli(root, "sim", "reply", goal_id)  # the worker answers the first turn
    assert replied.returncode == 0, replied.stderr
    idle = _cli(root, "goal", "idle", goal_id)
    assert idle.returncode == 0, idle.stderr
    return root, goal_id


def _copy(template: Path, to: Path) -> Path:
    shutil.copytree(template, to)
    return to


def test_every_crash_point_recovers_to_the_live_identity(template: tuple[Path, str], tmp_path: Path) -> None:
    root, goal_id = template
    switch = ("goal", "switch-identity", goal_id, "--model", NEW[0], "--agent", NEW[1])
    clean = _copy(root, tmp_path / "clean")
    trace = tmp_path / "trace.txt"
    done = _cli(clean, *switch, env={"LOOPD_ES_CRASH_TRACE": str(trace)})
    assert done.returncode == 0, done.stderr
    points = trace.read_text().splitlines()
    labels = " ".join(points)
    assert "before host forward switch_model" in labels and "after host forward switch_agent" in labels
    assert "before append goal-" in labels and "after append switch-" in labels
    assert anyio.run(_check, clean, goal_id) == NEW
    outcomes = set()
    for k in range(1, len(points) + 1):
        workdir = _copy(root, tmp_path / f"k{k}")
        killed = _cli(workdir, *switch, env={"LOOPD_ES_CRASH_AT": str(k)})
        assert killed.returncode == -signal.SIGKILL, f"point {k} ({points[k - 1]}): {killed.stderr}"
        recovered = _cli(workdir, "goal", "recover")
        assert recovered.returncode == 0, recovered.stderr
        outcomes.add(anyio.run(_check, workdir, goal_id))
    assert outcomes == {OLD, NEW}  # early deaths roll back, late ones complete
