"""``loopd-es run`` through long outages and a full disk, with a goal in flight (issue #21, item 2).

Real processes on real stores. A PostgreSQL server of the test's own is stopped for two minutes under a holder
and a standby while, at the same time, an SQLite log is locked by another process for two minutes under its
own holder and standby (both outages run side by side: the test lasts about the two minutes, not four). Each
engine says once that it waits (stderr and ``loopd-es engines``), never exits, and the goal whose turn was in
flight finishes afterwards with each prompt sent once.

The full disk is an ``RLIMIT_FSIZE`` set on the running engine with ``prlimit`` (no root, no mount: what a CI
machine allows). A process over its file-size limit gets ``EFBIG`` where a full disk gives ``ENOSPC`` (Python
ignores ``SIGXFSZ``), and SQLite answers both with a failed write that rolls the transaction back. Raising the
limit again is the space coming back.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest

from loopd_es.domain.evolve import fold, initial
from loopd_es.domain.streams import goal_stream
from loopd_es.log import open_store
from tests.waits import let_time_pass, wait_for_output, wait_until

from .test_engine_unattended import _Server, server

if TYPE_CHECKING:
    from loopd_es.domain.state import GoalState

pytestmark = pytest.mark.slow
__all__ = ["server"]

OUTAGE_S = 120.0
MANUAL = '{"models": [{"provider": "p", "id": "m"}], "agents": [{"name": "build"}]}'
"""A host whose worker answers only when the test says so: a turn stays in flight across the outage."""
WAITING = "waiting for the store or host"


class _Site:
    """One log with its engines: a working directory, a store URL and a simulated host of its own."""

    def __init__(self, workdir: Path, url: str) -> None:
        self.dir, self.url = workdir, url
        workdir.mkdir(exist_ok=True)
        (workdir / "host.json").write_text(MANUAL)
        self.engines: dict[str, subprocess.Popen[str]] = {}

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPD_ES_CRASH")}
        env.update(LOOPD_ES_STORE=self.url, LOOPD_ES_HOST=f"sim:{self.dir / 'host.json'}")
        return env

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "loopd_es", *args],
            cwd=self.dir, env=self.env(), capture_output=True, text=True, timeout=90,
        )  # fmt: skip

    def start(self, name: str, *extra: str, preexec: Callable[[], None] | None = None) -> None:
        with (self.dir / f"{name}.err").open("w") as err:
            self.engines[name] = subprocess.Popen(
                [sys.executable, "-m", "loopd_es", "run", "--holder", name, "--confirm-idle-ms", "100",
                 "--maintenance-ms", "500", "--lease-ms", "2000", *extra],
                cwd=self.dir, env=self.env(), stdout=subprocess.DEVNULL, stderr=err, text=True,
                preexec_fn=preexec,
            )  # fmt: skip

    def ready(self, name: str, line: str) -> None:
        """Wait for engine ``name`` to print ``line`` (failing at once, with its output, if it exits first)."""
        wait_for_output(self.dir / f"{name}.err", line, process=self.engines[name], within=60)

    def err(self, name: str) -> str:
        return (self.dir / f"{name}.err").read_text()

    def prompted(self, session: str, count: int) -> bool:
        return len(self.prompts(session)) == count

    def alive(self) -> None:
        for name, process in self.engines.items():
            assert process.poll() is None, f"{name} exited {process.returncode}: {self.err(name)}"

    def stop_all(self) -> None:
        for name, process in reversed(self.engines.items()):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=60)
            err = self.err(name)
            assert process.returncode == 0, f"{name} exited {process.returncode}: {err}"
            assert "Traceback" not in err and "internal error" not in err, err

    def states(self) -> list[str]:
        out = self.cli("engines", "--json")
        return sorted(d["state"] for d in json.loads(out.stdout)["here"])

    def create(self, *extra: str) -> tuple[str, str]:
        out = self.cli("goal", "create", "g", "--objective", "o", "--model", "p/m", "--agent", "build",
                       "--read-only", *extra)  # fmt: skip
        assert out.returncode == 0, out.stderr
        goal_id = out.stdout.splitlines()[0]
        session = self.goal(goal_id).worker_session_id
        assert session is not None
        return goal_id, session

    def goal(self, goal_id: str) -> GoalState:
        async def load() -> GoalState:
            async with await open_store(self.url) as store:
                return fold([e async for e in store.read_stream(goal_stream(goal_id))], initial(goal_id))

        return anyio.run(load)

    def prompts(self, session: str) -> list[str]:
        state = json.loads((self.dir / "host.state.json").read_text())
        return [p["text"] for p in state.get("prompts", []) if p["session_id"] == session]

    def reply(self, session: str) -> None:
        """The worker answers its latest prompt and goes idle: only the host's files are touched."""
        out = self.cli("sim", "reply", session)
        assert out.returncode == 0, out.stderr

    def finish(self, goal_id: str, session: str, answered: int) -> list[str]:
        """Answer each new prompt until the goal blocks at its turn limit (after its final turn); the prompts."""

        def ended() -> bool:
            nonlocal answered
            if len(self.prompts(session)) > answered:
                self.reply(session)
                answered += 1
            return self.goal(goal_id).status == "blocked"

        wait_until("the goal to reach its end", ended, within=90)
        sent = self.prompts(session)
        assert len(sent) == answered and len(set(sent)) == len(sent), sent  # no prompt went out twice
        return sent


@pytest.mark.timeout(OUTAGE_S + 180)
def test_two_minute_outages_of_postgresql_and_sqlite_are_waited_out_and_the_goal_in_flight_finishes(
    tmp_path: Path, server: _Server
) -> None:
    pg = _Site(tmp_path / "pg", server.url)
    lite = _Site(tmp_path / "lite", f"sqlite:{tmp_path / 'lite' / 'events.db'}")
    sites = (pg, lite)
    locker: sqlite3.Connection | None = None
    try:
        for site in sites:
            site.start("holder")
            site.ready("holder", "engine running")
            site.start("standby")
            site.ready("standby", "standing by")
        goals = {site.url: site.create("--max-turns", "2") for site in sites}
        for site in sites:
            assert len(site.prompts(goals[site.url][1])) == 1  # turn 1 is with the worker

        server.stop()
        locker = sqlite3.connect(tmp_path / "lite" / "events.db", isolation_level=None)
        locker.execute("BEGIN EXCLUSIVE")  # no other process can write the log now
        outage_ends = time.monotonic() + OUTAGE_S
        for site in sites:  # the worker finishes its turn while the log cannot record it
            site.reply(goals[site.url][1])
        wait_until("the PostgreSQL holder to say it waits", lambda: WAITING in pg.err("holder"), within=30)
        wait_until(
            "the statuses of the PostgreSQL engines to say so",
            lambda: pg.states() == [WAITING, WAITING],
            within=30,
        )
        # an engine waits for SQLite's write lock at most its lease (2 s), not SQLite's own 60 s
        wait_until("the SQLite holder to say it waits", lambda: WAITING in lite.err("holder"), within=30)
        assert WAITING in lite.states(), lite.states()
        for site in sites:
            site.alive()
        let_time_pass(max(0.0, outage_ends - time.monotonic()), "the outage lasts its two minutes")
        for site in sites:
            site.alive()
        server.start()
        locker.execute("ROLLBACK")
        locker.close()
        locker = None

        for site in sites:
            goal_id, session = goals[site.url]
            wait_until("turn 2 after the outage", partial(site.prompted, session, 2), within=60)
            site.finish(goal_id, session, answered=1)
            wait_until(
                f"the statuses on {site.url} to say the engines carry on",
                site.states,
                done=lambda states: states == ["running", "standing by"],
                within=30,
            )
            for name in ("holder", "standby"):
                assert site.err(name).count(WAITING) <= 1, site.err(name)
                assert site.err(name).count("answer again") == site.err(name).count(WAITING), site.err(name)
            assert site.err("holder").count(WAITING) == 1, site.err("holder")
            site.alive()
    finally:
        if locker is not None:
            locker.execute("ROLLBACK")
            locker.close()
        for site in sites:
            site.stop_all()


@pytest.mark.timeout(120)
def test_a_full_disk_is_reported_once_waited_out_and_leaves_a_verifiable_log(tmp_path: Path) -> None:
    site = _Site(tmp_path / "site", f"sqlite:{tmp_path / 'site' / 'events.db'}")
    site.start("e")
    try:
        site.ready("e", "engine running")
        pid = site.engines["e"].pid
        hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)[1]
        # no file of the engine may grow past 4 KiB: every SQLite write (a WAL frame is 4 KiB + 24 bytes) fails
        # the way a full disk fails it, while the engine's status file (under 1 KiB) still fits
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (4096, hard))
        goal_id, session = site.create("--max-turns", "2")  # from another process: its disk is not full
        site.reply(session)  # turn 1 ends while the engine cannot record it
        wait_until("the engine to say it waits", lambda: WAITING in site.err("e"), within=30)
        wait_until("its status to say so", lambda: site.states() == [WAITING], within=30)
        let_time_pass(3.0, "the disk stays full for a while: every retry in it fails again")
        site.alive()
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (hard, hard))  # space returns
        wait_until("turn 2 after the space returned", lambda: len(site.prompts(session)) == 2, within=60)
        site.finish(goal_id, session, answered=1)
        wait_until("the status to say it runs", lambda: site.states() == ["running"], within=30)
        err = site.err("e")
        assert err.count(WAITING) == 1, err
        assert "answer again" in err, err
        site.alive()
    finally:
        site.stop_all()
    verified = site.cli("verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    with sqlite3.connect(tmp_path / "site" / "events.db") as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
