"""The installed tool files, run by OpenCode's own Bun, reach ``loopd-es run`` over its Unix socket and nothing else.

Real processes throughout: ``loopd-es opencode install``, ``loopd-es run`` (simulated host, SQLite log), the
generated ``.opencode/tool/*.ts`` files executed by the Bun inside the pinned OpenCode binary
(``BUN_BE_BUN=1``), and a squatter process listening on the old fixed port 47321, which must receive nothing.
The last test needs no OpenCode: an engine whose tool socket cannot be served gives its lease back.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from loopd_es.clock import SystemClock
from loopd_es.engine.core import EngineConfig
from loopd_es.engine.daemon import RunOptions, run_daemon
from loopd_es.engine.lease import Lease
from loopd_es.engine.tool_api import TOOLS
from loopd_es.log import open_store
from loopd_es.procs.paths import UnsafeDirectoryError
from tests.waits import wait_for_output

from ..opencode.server import opencode_dir
from .test_opencode_e2e import cli

OLD_PORT = 47321
ROOT = Path(__file__).resolve().parents[2]
SQUATTER = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError as e:
    print("busy", e, flush=True)
    sys.exit(0)
s.listen()
print("ready", flush=True)
while True:
    conn, _ = s.accept()
    print("CONNECTION", conn.recv(65536), flush=True)
"""
CALL = """
const [name, args, context] = process.argv.slice(2)
const tool = (await import(`./.opencode/tool/${name}.ts`)).default
const answer = await tool.execute(JSON.parse(args), JSON.parse(context))
if (typeof answer !== "string") console.error("TITLE " + answer.title)
console.log(typeof answer === "string" ? answer : answer.output)
"""


SCHEMA = """
import { tool } from "@opencode-ai/plugin"
const out: Record<string, unknown> = {}
for (const name of JSON.parse(process.argv[2])) {
  const made = (await import(`./tool/${name}.ts`)).default
  out[name] = tool.schema.toJSONSchema(tool.schema.object(made.args))
}
console.log(JSON.stringify(out))
"""


class Project:
    """An installed project with its engine, its squatter and a way to call a tool as OpenCode would."""

    def __init__(self, root: Path, runtime: Path) -> None:
        self.bun = opencode_dir() / "bin" / "opencode"
        self.dir = root / "project"
        self.dir.mkdir()
        self.env = {
            **os.environ,
            "XDG_RUNTIME_DIR": str(runtime),
            "LOOPD_ES_STORE": "",
            "LOOPD_ES_HOST": "",
            "PYTHONPATH": str(ROOT),
        }
        self.env.pop("LOOPD_ES_STORE")
        self.env.pop("LOOPD_ES_HOST")
        installed = self.cli("opencode", "install", ".")
        assert installed.returncode == 0, installed.stderr
        shutil.copytree(
            opencode_dir() / "plugin" / "node_modules", self.dir / ".opencode" / "node_modules", symlinks=True
        )
        (self.dir / "call.ts").write_text(CALL)
        self.config = json.loads((self.dir / ".opencode" / "loopd" / "engine.json").read_text())
        self.engine: subprocess.Popen[str] | None = None
        self.engine_log = root / "engine.log"
        self.last_title: str | None = None

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return cli(self.dir, self.env, *args)

    def start_engine(self) -> None:
        with self.engine_log.open("w") as out:
            self.engine = subprocess.Popen(
                [sys.executable, "-m", "loopd_es.cli", "run", "--lease-ms", "3000"],
                cwd=self.dir,
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=out,
                text=True,
            )
        wait_for_output(self.engine_log, "serving the OpenCode tools", process=self.engine)

    def stop_engine(self) -> None:
        if self.engine is not None and self.engine.poll() is None:
            self.engine.send_signal(signal.SIGTERM)
            assert self.engine.wait(timeout=30) == 0, self.engine_log.read_text()

    def call(
        self, tool: str, args: dict[str, Any], session: str = "ses_owner", call: str = "call_1"
    ) -> dict[str, Any]:
        """``tool``'s answer to ``args``, called as OpenCode does from ``session`` (message ``msg_<n>``, call
        ``call``; the title OpenCode would show is kept in :attr:`last_title`)."""
        message = "msg_1" if call == "call_1" else f"msg_{call}"
        context = {"sessionID": session, "messageID": message, "callID": call, "agent": "build"}
        done = subprocess.run(
            [str(self.bun), "run", "call.ts", tool, json.dumps(args), json.dumps(context)],
            cwd=self.dir,
            env={**self.env, "BUN_BE_BUN": "1"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        titles = [line[6:] for line in done.stderr.splitlines() if line.startswith("TITLE ")]
        self.last_title = titles[-1] if titles else None
        answer: dict[str, Any] = json.loads(done.stdout)
        return answer


@pytest.fixture
def squatter() -> Iterator[subprocess.Popen[str]]:
    """Another process listening on the port every project used to share."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SQUATTER, str(OLD_PORT)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()
    try:
        if first.startswith("busy"):
            pytest.skip(f"port {OLD_PORT} is in use here: {first.strip()}")
        assert first == "ready\n"
        yield proc
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Project]:
    with tempfile.TemporaryDirectory(prefix="rt-") as runtime:  # short: a socket path has ~100 bytes
        os.chmod(runtime, 0o700)
        made = Project(tmp_path, Path(runtime))
        try:
            yield made
        finally:
            if made.engine is not None and made.engine.poll() is None:
                made.engine.kill()
                made.engine.wait()


@pytest.mark.slow
def test_the_tools_reach_the_engine_and_the_old_port_hears_nothing(
    project: Project, squatter: subprocess.Popen[str]
) -> None:
    project.start_engine()
    created = project.call("loopd_create_goal", {"name": "docs", "objective": "write the guide"})
    assert created["ok"] is True and "title" not in created, created
    assert project.last_title == "Goal created"  # OpenCode shows the reference's title, apart from the output
    listed = project.call("list_background_goals", {})
    assert [g["name"] for g in listed["goals"]] == ["docs"]
    refused = project.call("list_background_goals", {}, session="main")
    assert refused == {"ok": False, "errorCode": "no_session", "message": "No session context available."}
    project.stop_engine()
    shown = project.cli("goal", "show", created["goalID"], "--json")
    assert shown.returncode == 0 and "write the guide" in shown.stdout, shown.stderr

    squatter.kill()
    assert squatter.stdout is not None
    assert "CONNECTION" not in squatter.stdout.read()
    assert str(OLD_PORT) not in json.dumps(project.config)


@pytest.mark.slow
def test_the_schema_opencode_sees_is_the_structs(project: Project) -> None:
    """OpenCode's own zod (in its Bun) turns each installed tool's arguments into the JSON schema the model is
    given: it must be the tool's Struct's schema, field for field, bounds and descriptions included."""
    (project.dir / ".opencode" / "schema.ts").write_text(SCHEMA)
    done = subprocess.run(
        [str(project.bun), "run", "schema.ts", json.dumps(sorted(TOOLS))],
        cwd=project.dir / ".opencode",
        env={**project.env, "BUN_BE_BUN": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert sorted(seen) == sorted(TOOLS)
    for name, schema in seen.items():
        schema.pop("$schema")
        schema.setdefault("required", [])
        for prop in schema["properties"].values():  # zod says JSON object keys are strings; they always are
            if prop.get("propertyNames") == {"type": "string"}:
                del prop["propertyNames"]
        assert schema == TOOLS[name].schema(), name


@pytest.mark.slow
def test_tool_arguments_are_checked_at_the_engine_and_every_option_reaches_the_goal(project: Project) -> None:
    project.start_engine()
    wrong = project.call("loopd_create_goal", {"name": "g", "objective": "o", "workspaceWrite": "false"})
    assert wrong == {
        "ok": False,
        "errorCode": "invalid_arguments",
        "message": "Invalid arguments for loopd_create_goal: Expected `bool`, got `str` - at `$.workspaceWrite`.",
    }
    assert project.last_title == "Goal not created"
    nul = project.call("loopd_create_goal", {"name": "g", "objective": "o", "checkCwd": "a\x00b"})
    assert nul["errorCode"] == "invalid_arguments" and "`$.checkCwd`" in nul["message"], nul
    options = {"maxFailures": 2, "maxNoProgress": 3, "compactEvery": 4, "timeoutMs": 60_000, "tokenBudget": 500,
               "scheduleEveryMs": 5000, "scheduleMaxRuns": 3, "workspaceWrite": False}  # fmt: skip
    created = project.call("loopd_create_goal", {"name": "g", "objective": "o", **options})
    assert created["ok"] is True and {k: created[k] for k in options} == options, created
    assert created["workerSessionID"] and created["goalID"]
    project.stop_engine()
    shown = project.cli("goal", "show", created["goalID"], "--json")
    assert shown.returncode == 0, shown.stderr
    assert {k: json.loads(shown.stdout)["goal"]["options"][k] for k in options} == options


@pytest.mark.slow
def test_a_tool_answers_in_json_when_no_engine_serves(project: Project) -> None:
    answer = project.call("get_goal", {})
    assert answer["ok"] is False
    assert "not serving tools" in answer["message"] and "loopd-es run" in answer["message"]


@pytest.mark.slow
@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a directory to another user")
def test_a_tool_sends_nothing_to_a_socket_directory_of_another_user(project: Project) -> None:
    where = Path(project.config["socket"]).parent
    where.mkdir(mode=0o700)
    os.chown(where, 65534, 65534)
    try:
        answer = project.call("get_goal", {})
        started = project.cli("run")  # the engine refuses it too, before it takes the lease
    finally:
        os.chown(where, 0, 0)
    assert answer["ok"] is False and "not a directory only you can enter" in answer["message"]
    assert started.returncode == 4, started.stderr
    assert "tool socket: it belongs to uid 65534" in started.stderr and len(started.stderr.splitlines()) == 1


@pytest.mark.anyio
async def test_an_engine_that_cannot_serve_its_tools_gives_its_fresh_lease_back(tmp_path: Path) -> None:
    """Before: a standby whose tool port was busy died holding the lease it had just taken, for a whole TTL."""
    with tempfile.TemporaryDirectory(prefix="rt-") as short:
        real = Path(short) / "real"
        real.mkdir(mode=0o700)
        (Path(short) / "link").symlink_to(real)  # not a real directory: the server refuses it
        config = tmp_path / "engine.json"
        config.write_text(json.dumps({"socket": f"{short}/link/t.sock", "token": "x"}))
        store = f"sqlite:{tmp_path / 'events.db'}"
        options = RunOptions(
            store_url=store,
            host_url=f"sim:{tmp_path / 'host.json'}",
            holder="first",
            config=EngineConfig(),
            tool_api=config,
            loops=False,
        )
        with pytest.raises(ExceptionGroup) as failed:
            await run_daemon(options, anyio.Event(), lambda line: None)
    assert failed.group_contains(UnsafeDirectoryError, match="not a directory")
    async with await open_store(store) as log:
        assert await Lease(log, "second", SystemClock()).try_acquire() is None  # free at once
