"""Real commands in real PTYs tell the session that started them, through the engine
(docs/reference/loopd.md#s3-17): one exit notice,
none for a terminated command, watch pushes as they come, one message for an until-stop."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from loopd_es.events.command import WatchSpec
from loopd_es.procs import owner_link, service
from loopd_es.procs.paths import CommandPaths, owner_alive
from tests.waits import await_until

from ..unit._engine_harness import Rig, rig
from .test_procs_support import PY, Env

if TYPE_CHECKING:
    from loopd_es.domain.command import CommandState

pytestmark = pytest.mark.anyio
OWNER = "ses_owner"


@dataclass
class Bench:
    r: Rig
    env: Env

    async def start(self, body: str, *, owner: str | None = OWNER, watch: WatchSpec | None = None) -> str:
        spec = service.StartSpec(
            title="dev", command=PY, args=["-c", body], owner_session_id=owner, watch=watch
        )
        cid, pid = await service.start_command(self.r.store, self.env.url, spec)
        self.env.pids.add(pid)
        return cid

    async def ended(self, cid: str) -> CommandState:
        return await self.env.until(self.r.store, cid, lambda s: not s.running)

    async def texts(self, *, at_least: int = 0, within: float = 30) -> list[str]:
        """The notices shown so far, once the engine caught up (waiting for ``at_least`` of them)."""

        async def shown() -> list[str]:
            await self.r.engine.catch_up()
            return [n.text for n in await self.r.host.notifications() if n.session_id == OWNER]

        return await await_until(
            f"{at_least} notices to the owner", shown, done=lambda t: len(t) >= at_least, within=within
        )


@pytest.fixture
async def bench(tmp_path: Path) -> AsyncIterator[Bench]:
    env = Env(tmp_path)
    env.url = f"sqlite:{tmp_path / 'events.db'}"  # the rig's log
    env.paths = CommandPaths(env.url)
    try:
        async with rig(tmp_path) as r:
            yield Bench(r, env)
            for st in await service.list_states(r.store):
                env.pids.update(p for p in (st.pid, st.supervisor_pid) if p)
    finally:
        env.kill_all()


async def test_exit_codes_zero_and_non_zero_each_tell_the_owner_once(bench: Bench) -> None:
    ok = await bench.start("print('all good')")
    await bench.ended(ok)
    bad = await bench.start("import sys\nprint('it broke')\nsys.exit(4)")
    await bench.ended(bad)
    texts = await bench.texts(at_least=2)
    assert len(texts) == 2
    assert (
        texts[0].startswith(f'[command "dev" ({PY} -c ')
        and f"exited {ok[:8]}... exitCode=0 signal=none]" in texts[0]
    )
    assert "all good" in texts[0].split("\n", 1)[1]  # the output tail follows the head line
    assert f"exited {bad[:8]}... exitCode=4 signal=none]" in texts[1] and "it broke" in texts[1]
    await bench.r.engine.catch_up()
    assert len(await bench.texts()) == 2  # caught up again: nothing new


async def test_a_terminated_command_and_a_cli_command_tell_nobody(bench: Bench) -> None:
    long = await bench.start("import time\nprint('up', flush=True)\ntime.sleep(30)")
    await bench.env.until(bench.r.store, long, lambda s: b"up" in bench.env.output(long))
    await service.command_request(bench.r.store, bench.env.paths, long, owner_link.Terminate())
    cli = await bench.start("import sys\nsys.exit(2)", owner=None)
    assert (await bench.ended(long)).status == "terminated"
    await bench.ended(cli)
    assert await bench.texts() == []


async def test_watch_pushes_then_the_exit_notice(bench: Bench) -> None:
    body = (
        "import time\nfor l in ['starting up', 'ERROR one', 'ERROR two']: print(l, flush=True)\n"
        "time.sleep(2.6)\n"
    )
    cid = await bench.start(body, watch=WatchSpec(filter="ERROR"))
    await bench.ended(cid)
    texts = await bench.texts(at_least=2)
    assert len(texts) == 2
    assert texts[0].startswith('[watch "dev"]') and "ERROR one" in texts[0] and "ERROR two" in texts[0]
    assert "starting up" not in texts[0]
    assert f"exited {cid[:8]}... exitCode=0" in texts[1]


async def test_until_stop_gives_exactly_one_owner_message(bench: Bench) -> None:
    body = "import time\nprint('boot', flush=True)\nprint('READY', flush=True)\ntime.sleep(30)\n"
    cid = await bench.start(body, watch=WatchSpec(filter="o|READY", until="READY"))
    s = await bench.ended(cid)
    assert (s.status, s.end_reason) == ("terminated", "until")
    await bench.texts(at_least=1)
    # once the owner has let go of the command, nothing more can be recorded for it (an exit ping included)
    lock = bench.env.paths.lock(cid)
    await await_until(f"command {cid}'s owner to exit", lambda: not owner_alive(lock))
    texts = await bench.texts()
    assert len(texts) == 1
    assert texts[0].startswith('[watch "dev"]') and texts[0].endswith(
        '-- until "READY" matched (action=stop)'
    )
