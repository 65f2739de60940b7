"""``loopd-es run`` left running: it writes no heartbeat into the log, and it waits out what can pass.

Real processes on real stores: an idle engine renewing its lease many times appends nothing; a PostgreSQL
server stopped for longer than the lease and started again is waited out by the holder and its standby (each
says so once, then carries on and drives a goal created afterwards); a SQLite log locked by another process
is waited out; a shared member stopped with SIGSTOP past its membership rejoins when it resumes; bad
durations are refused with exit 2; two engines started with one name do not take the lease from each other.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from loopd_es.log import open_store
from loopd_es.log.coord import Claim
from tests.waits import let_time_pass, wait_until

from ..components import require

pytestmark = pytest.mark.slow

SCRIPT = '{"models": [{"provider": "p", "id": "m"}], "agents": [{"name": "build"}], "auto_reply": true}'


def _env(workdir: Path, store: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPD_ES_CRASH")}
    env.update(LOOPD_ES_STORE=store, LOOPD_ES_HOST=f"sim:{workdir / 'host.json'}")
    return env


def _engine(workdir: Path, store: str, name: str, *extra: str) -> subprocess.Popen[str]:
    (workdir / "host.json").write_text(SCRIPT)
    with (workdir / f"{name}.err").open("w") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "loopd_es", "run", "--holder", name, "--confirm-idle-ms", "100", *extra],
            cwd=workdir, env=_env(workdir, store), stdout=subprocess.DEVNULL, stderr=err, text=True,
        )  # fmt: skip


def _err(workdir: Path, name: str) -> str:
    return (workdir / f"{name}.err").read_text()


def _stop(process: subprocess.Popen[str], workdir: Path, name: str) -> str:
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=30)
    err = _err(workdir, name)
    assert process.returncode == 0, err
    assert "Traceback" not in err and "internal error" not in err, err
    return err


def _coord(url: str, prefix: str) -> list[Claim]:
    async def read() -> list[Claim]:
        async with await open_store(url) as store:
            return await store.coord_read(prefix)

    return anyio.run(read)


def _head(url: str) -> int:
    async def read() -> int:
        async with await open_store(url) as store:
            return await store.head()

    return anyio.run(read)


def _lease(url: str) -> Claim | None:
    return next((c for c in _coord(url, "engine/lease") if c.key == "engine/lease"), None)


def test_an_idle_engine_renews_many_times_and_appends_nothing(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'events.db'}"
    engine = _engine(tmp_path, url, "idle", "--lease-ms", "300")
    try:
        seen: set[int] = set()

        def renewed() -> bool:
            lease = _lease(url)
            if lease is not None and lease.holder.startswith("idle/"):
                seen.add(lease.expires_us)
            return len(seen) >= 10

        wait_until("ten lease renewals", renewed, within=60)
    finally:
        _stop(engine, tmp_path, "idle")
    assert _head(url) == 0, "an idle engine wrote to the goals' log"
    lease = _lease(url)
    assert lease is not None and lease.holder == "", "a clean stop releases the lease"
    assert not _coord(url, "loop/owner/"), "a clean stop removes the engine's /loop owner lease"


def test_bad_durations_are_refused_with_exit_2(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'events.db'}"
    for flag in ("--lease-ms", "--maintenance-ms", "--claim-ttl-ms"):
        for value in ("0", "-5", str(366 * 86_400_000)):
            out = subprocess.run(
                [sys.executable, "-m", "loopd_es", "run", flag, value],
                cwd=tmp_path, env=_env(tmp_path, url), capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert out.returncode == 2, (flag, value, out.stderr)
            assert f"{flag} must be from 100 to 31536000000, got {value}" in out.stderr, out.stderr


def test_two_engines_of_one_name_do_not_take_the_lease_from_each_other(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'events.db'}"
    first = _engine(tmp_path, url, "same", "--lease-ms", "1000")
    wait_until("the first engine", lambda: "engine running" in _err(tmp_path, "same"))
    (tmp_path / "same.err").rename(tmp_path / "same-1.err")
    second = _engine(tmp_path, url, "same", "--lease-ms", "1000")
    try:
        wait_until("the second to stand by", lambda: "standing by" in _err(tmp_path, "same"))
        tokens: set[int] = set()
        renewals: set[int] = set()

        def three_renewals() -> int:
            lease = _lease(url)
            if lease is not None:
                tokens.add(lease.token)
                renewals.add(lease.expires_us)
            return len(renewals)

        # three renewals, counted rather than timed: a flapping pair would move the token ~30 times a second
        wait_until("three lease renewals with both engines up", three_renewals, done=lambda n: n >= 4)
        assert len(tokens) == 1, f"the lease changed hands between live engines: tokens {tokens}"
        assert "engine running" not in _err(tmp_path, "same")
    finally:
        _stop(second, tmp_path, "same")
        (tmp_path / "same-1.err").rename(tmp_path / "same.err")
        _stop(first, tmp_path, "same")


def test_a_sqlite_log_locked_by_another_process_is_waited_out(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'events.db'}"
    engine = _engine(tmp_path, url, "e", "--lease-ms", "1000")
    try:
        wait_until("the engine", lambda: "engine running" in _err(tmp_path, "e"))
        locker = sqlite3.connect(tmp_path / "events.db", isolation_level=None)
        locker.execute("BEGIN EXCLUSIVE")  # every other writer and reader of the file now waits
        let_time_pass(3.0, "the log stays locked for three lease lengths")
        locker.execute("ROLLBACK")
        locker.close()
        wait_until("the engine to hold the lease again", lambda: (_lease(url) or Claim(key="", holder="", token=0,
                 expires_us=0)).holder.startswith("e/"))  # fmt: skip
        assert engine.poll() is None, _err(tmp_path, "e")
    finally:
        _stop(engine, tmp_path, "e")


def test_a_shared_member_stalled_past_its_membership_rejoins(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'events.db'}"
    member = _engine(tmp_path, url, "m", "--shared", "--lease-ms", "600")
    try:
        wait_until("the member", lambda: "engine running" in _err(tmp_path, "m"))
        member.send_signal(signal.SIGSTOP)  # a laptop suspend
        let_time_pass(2.0, "the member stays stopped past its 600 ms membership")
        member.send_signal(signal.SIGCONT)
        now_us = time.time_ns() // 1000

        def live_again() -> bool:
            return any(r.expires_us > now_us for r in _coord(url, "engine/member/"))

        wait_until("the member to renew again", live_again)
        renewed = max(r.expires_us for r in _coord(url, "engine/member/"))
        wait_until(
            "the member to renew once more after rejoining",
            lambda: (
                any(r.expires_us > renewed for r in _coord(url, "engine/member/"))
                or member.poll() is not None
            ),
        )
        assert member.poll() is None, _err(tmp_path, "m")
    finally:
        _stop(member, tmp_path, "m")


# -- a PostgreSQL server of the test's own, stopped and started under running engines --------------------------


class _Server:
    def __init__(self, root: Path) -> None:
        found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
        require(found, "PostgreSQL", "apt-get install postgresql")
        self.bin = found[-1].parent
        self.dir = root / "pg"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres?schema=outage"
        self.dir.mkdir()
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres")
            os.chmod(root, 0o755)
        self._run("initdb", "-D", str(self.dir), "-A", "trust", "-U", "postgres", "--no-sync")

    def _run(self, tool: str, *args: str) -> None:
        command = [str(self.bin / tool), *args]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.dir), "-l", str(self.dir / "log"), "-w", "-o",
                  f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1", "start")  # fmt: skip

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.dir), "-m", "fast", "-w", "stop")


@pytest.fixture
def server() -> Iterator[_Server]:
    root = Path(
        tempfile.mkdtemp(prefix="loopd-es-outage-")
    )  # not under pytest's 0700 tree: postgres must reach it
    server = _Server(root)
    server.start()
    try:
        yield server
    finally:
        try:
            server.stop()
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.timeout(240)
def test_a_postgresql_outage_longer_than_the_lease_is_waited_out_by_holder_and_standby(
    tmp_path: Path, server: _Server
) -> None:
    url = server.url
    _head(url)  # create the log
    holder = _engine(tmp_path, url, "holder", "--lease-ms", "2000")
    wait_until("the holder", lambda: "engine running" in _err(tmp_path, "holder"))
    standby = _engine(tmp_path, url, "standby", "--lease-ms", "2000")
    try:
        wait_until("the standby", lambda: "standing by" in _err(tmp_path, "standby"))
        server.stop()
        wait_until(
            "the holder to notice", lambda: "waiting for the store" in _err(tmp_path, "holder"), within=30
        )
        let_time_pass(10.0, "the outage lasts five lease lengths")
        assert holder.poll() is None and standby.poll() is None
        server.start()
        wait_until("an engine to run again", lambda: (_lease(url) or Claim(key="", holder="", token=0,
                 expires_us=0)).expires_us > time.time_ns() // 1000, within=60)  # fmt: skip
        for name in ("holder", "standby"):
            assert _err(tmp_path, name).count("waiting for the store") <= 1, _err(tmp_path, name)
        wait_until(
            "the status to say so",
            lambda: (
                sorted(d["state"] for d in json.loads(_engines(tmp_path, url).stdout)["here"])
                == ["running", "standing by"]
            ),
        )
        created = subprocess.run(
            [sys.executable, "-m", "loopd_es", "goal", "create", "g", "--objective", "o", "--model", "p/m",
             "--agent", "build", "--max-turns", "2", "--read-only"],
            cwd=tmp_path, env=_env(tmp_path, url), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert created.returncode == 0, created.stderr

        def blocked() -> bool:
            return any("goal.blocked" in line for line in _types(url))

        wait_until("the goal created after the outage to reach its end", blocked, within=60)
        assert holder.poll() is None and standby.poll() is None
    finally:
        for name, process in (("standby", standby), ("holder", holder)):
            if process.poll() is None:
                _stop(process, tmp_path, name)
    assert "internal error" not in _err(tmp_path, "holder") + _err(tmp_path, "standby")


def _engines(workdir: Path, url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loopd_es", "engines", "--json"],
        cwd=workdir, env=_env(workdir, url), capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def _types(url: str) -> list[str]:
    async def read() -> list[str]:
        async with await open_store(url) as store:
            return [e.type async for e in store.read_all()]

    return anyio.run(read)
