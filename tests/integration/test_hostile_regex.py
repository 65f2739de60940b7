"""No pattern can wedge a reader or an owner, and terminate/kill reach the child even when the owner is busy.

The patterns are the ones the reference's shape guard lets through and Python's backtracking ``re`` needs
exponential time for on a line of ``a``s. Time bounds are relative to the same command with a plain pattern
(measured in the same test), plus a fixed allowance for process start-up.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from loopd_es.domain.command import TERMINATE_GRACE_S
from loopd_es.events.command import WatchSpec
from loopd_es.patterns import compile_user_pattern
from loopd_es.procs import owner_link, service

from .test_procs_support import Env, env, store

if TYPE_CHECKING:
    from loopd_es.log.base import LogStore

__all__ = ["env", "store"]

HOSTILE = ["((a+))+$", "(a|a)*$", "(a{1,10})+$", "(a|aa)+$", "(?:a?){30}a{30}$"]
ADVERSARIAL = (
    "import time\nfor _ in range(200): print('a' * 40 + '!')\nprint('ready', flush=True)\ntime.sleep(60)\n"
)
CLI = shutil.which("loopd-es") or f"{sys.executable} -m loopd_es"


def _timed_cli(url: str, *argv: str, timeout: float = 60) -> tuple[float, subprocess.CompletedProcess[str]]:
    t0 = time.monotonic()
    done = subprocess.run(
        [*CLI.split(), "--store", url, "cmd", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return time.monotonic() - t0, done


def test_hostile_patterns_match_in_linear_time() -> None:
    plain = compile_user_pattern("a!")
    t0 = time.perf_counter()
    plain.search("a" * 5000 + "!")
    baseline = time.perf_counter() - t0  # a harmless search of the same text, on this machine, now
    for source in HOSTILE:
        pattern = compile_user_pattern(source)
        short = "a" * 12 + "!"  # short enough for Python's re: both engines agree
        assert bool(pattern.search(short)) == bool(re.search(source, short)), source
        t0 = time.perf_counter()
        pattern.search("a" * 5000 + "!")  # Python's re: longer than the age of the universe
        took = time.perf_counter() - t0
        assert took < 0.5 + 100 * baseline, (source, took, baseline)


@pytest.mark.anyio
async def test_read_pattern_returns_within_a_bound(env: Env, store: LogStore) -> None:
    cid = await env.start(store, "-c", ADVERSARIAL, title="adv")
    await env.until(store, cid, lambda s: b"ready" in env.output(cid))
    plain, done = _timed_cli(env.url, "read", cid, "--pattern", "ready")
    assert done.returncode == 0 and done.stdout.strip() == "ready", done.stderr
    for source in HOSTILE:
        took, done = _timed_cli(env.url, "read", cid, "--pattern", source)
        assert done.returncode == 0, done.stderr
        pattern = compile_user_pattern(source)
        expected = sum(1 for ln in env.output(cid).decode().splitlines() if pattern.search(ln))
        assert len(done.stdout.splitlines()) == expected, source
        assert took < 3 * plain + 2, (source, took, plain)
    await service.command_request(store, env.paths, cid, owner_link.Kill())


@pytest.mark.anyio
@pytest.mark.parametrize("source", HOSTILE[:3])
async def test_watch_filter_does_not_wedge_the_owner(env: Env, store: LogStore, source: str) -> None:
    cid = await env.start(store, "-c", ADVERSARIAL, title="adv", watch=WatchSpec(filter=source))
    await env.until(store, cid, lambda s: b"ready" in env.output(cid))
    # a wedged owner would not answer at all: within the request's own limit is the bound, not a guess at speed
    live = await owner_link.owner_request(env.paths, cid, owner_link.Status(), within=10)
    assert live is not None and live.ok, "the owner did not answer"
    msg = await service.command_request(store, env.paths, cid, owner_link.Terminate())
    assert msg == 'Command "adv" terminated.'
    s = await env.state(store, cid)
    assert (s.status, s.end_reason, s.signal) == ("terminated", "terminate", "SIGTERM")


@pytest.mark.anyio
@pytest.mark.parametrize("op", ["terminate", "kill"])
async def test_terminate_and_kill_reach_the_child_while_the_owner_loop_is_busy(
    env: Env, store: LogStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, op: str
) -> None:
    """The owner spins (test hook) on a line; terminate/kill still stop the child and the exit is recorded."""
    stall = 12.0
    monkeypatch.setenv("LOOPD_ES_TEST_STALL_ON", f"STALL-NOW:{stall}")
    marker = tmp_path / "got-sigterm"
    child = (
        "import signal, sys, time\n"
        f"def on_term(*a):\n    open({str(marker)!r}, 'w').write(repr(time.monotonic()))\n    sys.exit(143)\n"
        "signal.signal(signal.SIGTERM, on_term)\n"
        "print('ready', flush=True)\ntime.sleep(0.5)\nprint('STALL-NOW', flush=True)\ntime.sleep(60)\n"
    )
    cid = await env.start(store, "-c", child, title="busy")
    s = await env.until(store, cid, lambda s: b"STALL-NOW" in env.output(cid))
    stalled_at = time.monotonic()
    msg = await service.command_request(
        store, env.paths, cid, {"terminate": owner_link.Terminate(), "kill": owner_link.Kill()}[op]
    )
    took = time.monotonic() - stalled_at
    s = await env.until(store, cid, lambda s: not s.running, within=stall + 10)
    if op == "terminate":
        assert marker.exists(), "SIGTERM never reached the child"
        assert float(marker.read_text()) - stalled_at < stall  # the child got it while the owner still spun
        assert (s.status, s.end_reason, s.signal) == ("terminated", "terminate", "SIGTERM")
    else:
        assert (s.status, s.end_reason, s.signal) == ("terminated", "terminate", "SIGKILL")
    assert "busy" in msg and took < stall + TERMINATE_GRACE_S + 5, (msg, took)


def test_direct_signals_go_only_to_an_owner_that_handles_them(tmp_path: Path) -> None:
    """An owner from before the direct path has no SIGUSR1 handler and would die of it: it is not signalled."""
    from loopd_es.procs.service import DIRECT_TERMINATE, _catches

    script = tmp_path / "h.py"
    script.write_text(
        "import signal, sys, time\n"
        "if sys.argv[1] == 'yes': signal.signal(signal.SIGUSR1, lambda *a: None)\n"
        "print('ready', flush=True)\ntime.sleep(30)\n"
    )
    for handles in ("yes", "no"):
        proc = subprocess.Popen([sys.executable, str(script), handles], stdout=subprocess.PIPE)
        try:
            assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
            assert _catches(proc.pid, DIRECT_TERMINATE) is (handles == "yes")
        finally:
            proc.kill()
            proc.wait()
            assert proc.stdout is not None
            proc.stdout.close()
