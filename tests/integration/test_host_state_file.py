"""The simulated host's state file with real processes: shared live identity, no lost updates, ``kill -9``.

Children run :data:`CHILD` (``python -c``) against one ``sim:FILE`` and print one JSON line per call the
host acknowledged, flushed before the next call; whatever a child was told must be what the file says.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from loopd_es.host.sim_script import SimState, load_state

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
[[providers]]
id = "p"
[[models]]
provider = "p"
id = "a"
[[models]]
provider = "p"
id = "b"
[[agents]]
name = "x"
[[agents]]
name = "y"
[[sessions]]
id = "ses_1"
model = "p/a"
agent = "x"
[[failures]]
op = "switch_agent"
on_call = 3
error = "rejected"
"""

CHILD = r"""
import json, sys, time
import anyio
from loopd_es.host import open_host
from loopd_es.host.errors import HostError

def say(**kw):
    sys.stdout.write(json.dumps(kw) + "\n")
    sys.stdout.flush()

async def main(mode, url, count):
    host = await open_host(url)
    if mode == "flip":  # switch model and agent back and forth forever
        i = 0
        while True:
            model, agent = ("p/b", "y") if i % 2 == 0 else ("p/a", "x")
            await host.switch_model("ses_1", model)
            say(model=model)
            try:
                await host.switch_agent("ses_1", agent)
                say(agent=agent)
            except HostError as e:
                say(error=e.reason)
            i += 1
    elif mode == "hold":  # one switch, then wait to be killed
        say(result=await host.switch_model("ses_1", "p/b"))
        time.sleep(600)
    elif mode == "prompts":
        for _ in range(count):
            say(prompt=(await host.prompt("ses_1", "hi")).prompt_id)
    elif mode == "agent":
        try:
            say(result=await host.switch_agent("ses_1", "y"))
        except HostError as e:
            say(error=e.reason)

anyio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]))
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "host.toml"
    path.write_text(SCRIPT)
    return path


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def spawn(
    children: list[subprocess.Popen[str]], mode: str, script: Path, count: int = 0
) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, mode, f"sim:{script}", str(count)],
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=script.parent,
    )
    children.append(proc)
    return proc


def read_lines(proc: subprocess.Popen[str], n: int) -> list[dict[str, str]]:
    assert proc.stdout is not None
    lines = []
    for _ in range(n):
        line = proc.stdout.readline()
        assert line, f"child exited early with {proc.wait()}"
        lines.append(json.loads(line))
    return lines


def state_of(script: Path) -> SimState:
    state = load_state(script.with_name("host.state.json"))
    assert state is not None
    return state


def test_another_process_sees_the_live_identity_and_it_survives_kill_9(
    script: Path, children: list[subprocess.Popen[str]]
) -> None:
    holder = spawn(children, "hold", script)
    assert read_lines(holder, 1) == [{"result": "applied"}]
    assert state_of(script).sessions["ses_1"].model == "p/b"  # visible while the writer is still alive
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)
    assert state_of(script).sessions["ses_1"].model == "p/b"
    reader = spawn(children, "agent", script)
    assert read_lines(reader, 1) == [{"result": "applied"}]
    assert reader.wait(timeout=30) == 0
    session = state_of(script).sessions["ses_1"]
    assert (session.model, session.agent) == ("p/b", "y")


@pytest.mark.parametrize("acks", [7, 40, 121])
def test_kill_9_mid_switching_leaves_a_whole_state_with_the_acknowledged_identity(
    script: Path, children: list[subprocess.Popen[str]], acks: int
) -> None:
    proc = spawn(children, "flip", script)
    told = read_lines(proc, acks)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    state = state_of(script)  # decodes: a kill never leaves a torn file behind
    session = state.sessions["ses_1"]
    last_model = next(line["model"] for line in reversed(told) if "model" in line)
    models_in_flight = {last_model, "p/a" if last_model == "p/b" else "p/b"}
    assert session.model in models_in_flight
    # every acknowledged call is in the journal, in order, with the outcome the child was told
    acked = [(c.op, c.outcome) for c in state.calls if c.op in ("switch_model", "switch_agent")][: len(told)]
    expected = [
        ("switch_model", "applied")
        if "model" in line
        else ("switch_agent", "applied" if "agent" in line else "error:rejected")
        for line in told
    ]
    assert acked == expected
    assert ("switch_agent", "error:rejected") in acked[:6]  # the 3rd agent switch, and only that one, failed
    assert sum(1 for x in acked if x[1] == "error:rejected") == 1


def test_concurrent_processes_lose_no_update(script: Path, children: list[subprocess.Popen[str]]) -> None:
    procs = [spawn(children, "prompts", script, 40) for _ in range(3)]
    ids = [line["prompt"] for proc in procs for line in read_lines(proc, 40)]
    assert all(proc.wait(timeout=60) == 0 for proc in procs)
    state = state_of(script)
    assert len(set(ids)) == 120 and state.counters["prompt"] == 120 and state.next_prompt == 121
    assert sorted(p.prompt_id for p in state.prompts) == sorted(ids)


def test_the_nth_call_is_counted_across_processes(
    script: Path, children: list[subprocess.Popen[str]]
) -> None:
    outcomes = []
    for _ in range(4):
        proc = spawn(children, "agent", script)
        outcomes.extend(read_lines(proc, 1))
        assert proc.wait(timeout=30) == 0
    assert outcomes == [
        {"result": "applied"},
        {"result": "applied"},
        {"error": "rejected"},
        {"result": "applied"},
    ]


def test_the_state_file_is_plain_json_for_people_and_tools(
    script: Path, children: list[subprocess.Popen[str]]
) -> None:
    proc = spawn(children, "hold", script)
    read_lines(proc, 1)
    raw = json.loads(script.with_name("host.state.json").read_text())
    assert raw["sessions"]["ses_1"]["model"] == "p/b"
    assert msgspec.convert(raw, SimState).counters["switch_model"] == 1
