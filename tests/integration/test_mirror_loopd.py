"""``loopd-es mirror-loopd DIR --follow`` against a project another process writes over time.

The writer (:mod:`loopd_es.testing.loopd_project`) writes ``state.json`` atomically before each ledger
line, rotates the ledger and leaves a torn tail for a while; the mirror runs in its own process, is killed
with SIGKILL at a line where the writer waits for the test (``--hold-at``: no timing decides where the kill
falls) and started again. The mirrored log must then hold each ledger line's events exactly
once, in the streams and order a one-shot ``import-loopd`` of the final project puts them, and fold to the
final snapshot.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

import anyio
import pytest

from loopd_es.cli.main import main
from loopd_es.domain.evolve import evolve, initial
from loopd_es.events.catalogue import decode_payload
from loopd_es.events.imported import stamped
from loopd_es.importer.check import expected, folded
from loopd_es.importer.source import load_state
from loopd_es.log import open_store
from loopd_es.testing.loopd_project import empty_project, start_mirror
from tests.waits import wait_until

ROOT = Path(__file__).resolve().parents[2]
LINES = 33  # 3 goals x 11 steps


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("LOOPD_ES_STORE", None)
    return env


class Lines:
    """A child's stdout, one parsed JSON line at a time, read by a thread so waits can time out."""

    def __init__(self, stream: IO[str]) -> None:
        self.queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self.thread.start()

    def _pump(self, stream: IO[str]) -> None:
        with stream:
            for line in stream:
                self.queue.put(json.loads(line))
        self.queue.put(None)

    def closed(self) -> None:
        """Wait for the pipe's end (the child has exited) and its close."""
        self.thread.join(10)

    def until(self, test: Any, timeout: float = 20.0) -> dict[str, Any]:

        def next_line() -> dict[str, Any]:
            doc = self.queue.get(timeout=0.1)
            assert doc is not None, "the child ended before the condition held"
            return doc

        return wait_until(
            "a status line passing the test", next_line, done=test, within=timeout, ignoring=(queue.Empty,)
        )


def _until_mirrored(out: Lines, line: int) -> None:
    """Wait until the mirror has reported mirroring ledger line ``line`` (in this or an earlier pass)."""
    seen: set[int] = set()

    def has(doc: dict[str, Any]) -> bool:
        seen.update(doc.get("ledger_lines", ()))
        return line in seen

    out.until(has)


def _mirror(url: str, project: Path) -> tuple[subprocess.Popen[str], Lines]:
    proc = start_mirror(url, project, _env())
    assert proc.stdout is not None
    out = Lines(proc.stdout)
    out.until(lambda d: "stream" in d)  # its first pass is done: it is watching
    return proc, out


async def _ledger_sources(url: str) -> dict[str, list[str]]:
    """Each goal/command/control stream's ``ledger:<n>`` sources, in stream order."""
    result: dict[str, list[str]] = {}
    async with await open_store(url) as store:
        for stream in await store.streams():
            if stream.startswith("import-"):
                continue
            async for env in store.read_stream(stream):
                prov = stamped(env.data)[1]
                if prov is not None and prov.source.startswith("ledger:"):
                    result.setdefault(stream, []).append(prov.source)
    return result


async def _differences(url: str, project: Path) -> list[str]:
    """Fields where a mirrored goal's fold differs from the project's final snapshot."""
    state = load_state(project / ".opencode" / "loopd" / "state.json").state
    runtimes = {rt.goal_id: rt for rt in state.runtimes}
    found: list[str] = []
    async with await open_store(url) as store:
        for snap in state.goals:
            fold = initial(snap.id)
            if await store.stream_version(f"goal-{snap.id}"):
                async for env in store.read_stream(f"goal-{snap.id}"):
                    fold = evolve(fold, decode_payload(env))
            want = expected(snap, runtimes.get(snap.id))
            have = folded(fold, want)
            found += [f"{snap.id} {k}: {have[k]!r} != {want[k]!r}" for k in want if have[k] != want[k]]
    return found


@pytest.mark.parametrize("backend", ["sqlite", "ndjson"])
# killed before the rotation (line 14), after it, and while the ledger ends in the torn line 24
@pytest.mark.parametrize("kill_after", [8, 20, 24])
def test_a_killed_mirror_resumes_without_duplicates_or_gaps(
    tmp_path: Path, backend: str, kill_after: int
) -> None:
    project = tmp_path / "project"
    empty_project(project)
    url = f"{backend}:{tmp_path / 'mirror.log'}"
    mirror, out = _mirror(url, project)
    writer = subprocess.Popen(
        [sys.executable, "-m", "loopd_es.testing.loopd_project", str(project), "--goals", "3"]
        + ["--pace", "0.05", "--rotate-at", "14", "--torn-at", "24", "--hold-at", str(kill_after)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    assert writer.stdin is not None and writer.stdout is not None
    said = Lines(writer.stdout)
    try:
        held = said.until(lambda d: d.get("held") == kill_after)  # the writer waits: half written
        _until_mirrored(out, held["whole"])
        mirror.send_signal(signal.SIGKILL)
        mirror.wait(10)
        out.closed()
        mirror, out = _mirror(url, project)
        writer.stdin.write("go\n")
        writer.stdin.flush()
        assert said.until(lambda d: "done" in d, timeout=60) == {"done": LINES}
        assert writer.wait(10) == 0
        assert (project / ".opencode" / "loopd" / "events.ndjson.1").exists()  # it did rotate
        wait_until(
            "the mirror to hold what the project holds",
            lambda: anyio.run(_differences, url, project),
            done=lambda differences: differences == [],
        )
    finally:
        writer.kill()
        writer.wait(10)
        writer.stdin.close()
        said.closed()
        mirror.send_signal(signal.SIGTERM)
        code = mirror.wait(10)
        out.closed()
    assert code == 0
    once = f"sqlite:{tmp_path / 'once.db'}"
    assert main("--store", once, "import-loopd", str(project)) == 0
    mirrored_sources, imported = anyio.run(_ledger_sources, url), anyio.run(_ledger_sources, once)
    assert mirrored_sources == imported
    every = sorted(int(s[7:]) for sources in mirrored_sources.values() for s in sources)
    assert every == list(range(1, LINES + 1))


@pytest.mark.parametrize("follow", [False, True])
def test_the_first_pass_is_the_one_shot_import(tmp_path: Path, follow: bool) -> None:
    project = tmp_path / "project"
    from loopd_es.testing.loopd_project import main as write

    assert write([str(project), "--goals", "2", "--pace", "0"]) == 0
    os.utime(project / ".opencode" / "loopd" / "state.json", (0, 0))  # long settled
    url, once = f"sqlite:{tmp_path / 'm.db'}", f"sqlite:{tmp_path / 'i.db'}"
    if follow:
        mirror, out = _mirror(url, project)
        mirror.send_signal(signal.SIGTERM)
        assert mirror.wait(10) == 0
        out.closed()
    else:
        assert main("--store", url, "mirror-loopd", str(project)) == 0
    assert main("--store", once, "import-loopd", str(project)) == 0

    async def events(u: str) -> list[tuple[str, str, bytes]]:
        async with await open_store(u) as store:
            return [(e.stream, e.event_id, bytes(e.data)) async for e in store.read_all()]

    assert anyio.run(events, url) == anyio.run(events, once)
