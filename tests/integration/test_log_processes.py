"""The log with real processes: concurrent writers, expected-version races, ``kill -9``, torn and corrupt files.

Writers are ``tests/integration/log_writer.py`` children; each prints what it got acknowledged, and every
acknowledged event must be in the log exactly once, where the writer was told it is.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from loopd_es.errors import CorruptLogError, StorageError
from loopd_es.events.envelope import Envelope, NewEvent
from loopd_es.log import open_store
from tests.waits import wait_until

ROOT = Path(__file__).resolve().parents[2]
WRITER = Path(__file__).with_name("log_writer.py")
BACKENDS = ["ndjson", "sqlite"]


def url_for(backend: str, tmp_path: Path) -> str:
    return f"ndjson:{tmp_path / 'log.ndjson'}" if backend == "ndjson" else f"sqlite:{tmp_path / 'log.db'}"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("LOOPD_ES_STORE", None)
    return env


class Writers:
    """A group of writer processes that start appending together."""

    def __init__(self, tmp_path: Path, mode: str, url: str, ids: range, count: int) -> None:
        self.go = tmp_path / f"go-{mode}-{ids.start}"
        self.outs = [tmp_path / f"writer-{mode}-{w}.out" for w in ids]
        self.errs = [tmp_path / f"writer-{mode}-{w}.err" for w in ids]
        self.procs = []
        for w, out, err in zip(ids, self.outs, self.errs, strict=True):
            with out.open("wb") as o, err.open("wb") as e:
                self.procs.append(
                    subprocess.Popen(
                        [sys.executable, str(WRITER), mode, url, str(w), str(count), str(self.go)],
                        stdout=o,
                        stderr=e,
                        env=_env(),
                        cwd=tmp_path,
                    )
                )
        self._wait(lambda lines: any("ready" in x for x in lines), "ready")
        self.go.touch()

    def lines(self, i: int) -> list[dict[str, Any]]:
        """The complete lines writer ``i`` printed (a line cut by ``kill -9`` is not an acknowledgement)."""
        text = self.outs[i].read_text()
        return [json.loads(x) for x in text.splitlines(keepends=True) if x.endswith("\n")]

    def _wait(self, done: Any, what: str) -> None:
        def all_done() -> bool:
            for i, p in enumerate(self.procs):
                if p.poll() not in (None, 0):
                    raise AssertionError(f"writer {i} exited {p.returncode}: {self.errs[i].read_text()}")
            return all(done(self.lines(i)) for i in range(len(self.procs)))

        wait_until(f"every writer {what}", all_done)

    def wait_acks(self, n: int) -> None:
        self._wait(lambda lines: sum("ack" in x for x in lines) >= n, f"{n} acks")

    def finish(self, timeout: float = 45) -> None:
        for i, p in enumerate(self.procs):
            rc = p.wait(timeout)
            assert rc == 0, f"writer {i} exited {rc}: {self.errs[i].read_text()}"

    def kill(self) -> None:
        for p in self.procs:
            os.kill(p.pid, signal.SIGKILL)
        for p in self.procs:
            p.wait(10)

    def acks(self) -> list[dict[str, Any]]:
        return [x for i in range(len(self.procs)) for x in self.lines(i) if "ack" in x]

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)


@pytest.fixture
def writers() -> Iterator[list[Writers]]:
    groups: list[Writers] = []
    yield groups
    for g in groups:
        g.stop()


def read_log(url: str) -> list[Envelope]:
    async def go() -> list[Envelope]:
        async with await open_store(url) as s:
            return [e async for e in s.read_all()]

    return anyio.run(go)


def append(url: str, stream: str, n: int) -> list[Envelope]:
    async def go() -> list[Envelope]:
        async with await open_store(url) as s:
            return await s.append(stream, [NewEvent(type="test.seeded", data={"i": i}) for i in range(n)])

    return anyio.run(go)


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loopd_es", "--store", url, *args],
        check=False,
        capture_output=True,
        text=True,
        env=_env(),
        timeout=30,
    )


def assert_invariants(envs: list[Envelope]) -> None:
    assert [e.position for e in envs] == list(range(1, len(envs) + 1)), "positions are not gapless from 1"
    versions: Counter[str] = Counter()
    for e in envs:
        versions[e.stream] += 1
        assert e.version == versions[e.stream], f"stream {e.stream!r} version gap at position {e.position}"
    dupes = [k for k, n in Counter(e.event_id for e in envs).items() if n > 1]
    assert not dupes, f"event ids recorded more than once: {dupes[:5]}"


def assert_acks_recorded_once(acks: list[dict[str, Any]], envs: list[Envelope]) -> None:
    by_id = {e.event_id: e for e in envs}
    assert len(by_id) == len(envs)
    for a in acks:
        e = by_id.get(a["ack"])
        assert e is not None, f"acknowledged event {a} is not in the log"
        assert (e.position, e.stream, e.version) == (a["position"], a["stream"], a["version"]), (a, e)
    assert len({a["ack"] for a in acks}) == len(acks), "an event was acknowledged twice"


def assert_private_streams_in_order(envs: list[Envelope]) -> None:
    seen: dict[str, list[tuple[int, int]]] = {}
    for e in envs:
        if e.stream.startswith("private-"):
            d = e.data_dict()
            seen.setdefault(e.stream, []).append((d["i"], d["k"]))
    for stream, order in seen.items():
        assert order == sorted(order), f"{stream} is out of order"


# -- many writers ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_four_processes_append_concurrently(tmp_path: Path, backend: str, writers: list[Writers]) -> None:
    url = url_for(backend, tmp_path)
    group = Writers(tmp_path, "mix", url, range(4), 250)
    writers.append(group)
    group.finish()
    acks = group.acks()
    envs = read_log(url)
    assert len(acks) == 4 * (200 + 50 * 3)
    assert len(envs) == len(acks), "the log holds events nobody acknowledged, or lost some"
    assert_invariants(envs)
    assert_acks_recorded_once(acks, envs)
    assert_private_streams_in_order(envs)
    for w in range(4):
        assert sum(e.stream == f"private-{w}" for e in envs) == 125 + 25 * 2
    r = cli(url, "verify")
    assert r.returncode == 0, r


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_expected_version_race_has_one_winner_per_round(
    tmp_path: Path, backend: str, writers: list[Writers]
) -> None:
    url = url_for(backend, tmp_path)
    rounds = 60
    group = Writers(tmp_path, "race", url, range(4), rounds)
    writers.append(group)
    group.finish()
    lines = [x for i in range(4) for x in group.lines(i)]
    wins = [x for x in lines if "won" in x]
    losses = [x for x in lines if "lost" in x]
    assert sorted(x["won"] for x in wins) == list(range(1, rounds + 1)), "each round has exactly one winner"
    assert all(x["actual"] > x["lost"] for x in losses), [x for x in losses if x["actual"] <= x["lost"]][:5]
    envs = read_log(url)
    assert len(envs) == rounds
    assert_invariants(envs)
    assert {e.event_id: e.version for e in envs} == {x["ack"]: x["won"] for x in wins}
    for e in envs:
        assert e.data_dict()["v"] == e.version - 1, "a winner appended on top of a version it did not read"


# -- kill -9 --------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_kill_9_loses_no_acknowledged_event(tmp_path: Path, backend: str, writers: list[Writers]) -> None:
    url = url_for(backend, tmp_path)
    acks: list[dict[str, Any]] = []
    for start in (0, 4):  # the second group starts on whatever the first one left behind
        group = Writers(tmp_path, "mix", url, range(start, start + 4), 1_000_000)
        writers.append(group)
        group.wait_acks(40 + start * 10)
        group.kill()
        acks += group.acks()
    repaired = cli(url, "verify", "--repair")
    assert repaired.returncode == 0, repaired
    clean = cli(url, "verify")
    assert clean.returncode == 0, clean
    envs = read_log(url)
    assert_invariants(envs)
    assert_acks_recorded_once(acks, envs)
    assert_private_streams_in_order(envs)
    more = append(url, "after-crash", 2)
    assert [e.position for e in more] == [len(envs) + 1, len(envs) + 2]


# -- torn tail ------------------------------------------------------------------------------------

TORN = {
    "garbage": b'{"position": 6, "stream": "s", "vers',
    "binary": b"\x00\xff\x00\xfe partial",
    "truncated event": None,  # the first 60 % of the line event 6 would have been
}


@pytest.mark.parametrize("flavour", list(TORN))
def test_torn_tail_is_reported_and_repaired(tmp_path: Path, flavour: str) -> None:
    url = url_for("ndjson", tmp_path)
    path = tmp_path / "log.ndjson"
    append(url, "s", 5)
    good = path.read_bytes()
    tail = TORN[flavour]
    if tail is None:
        last = good.splitlines(keepends=True)[-1]
        tail = last.replace(b'"position":5', b'"position":6').replace(b'"version":5', b'"version":6')[
            : len(last) * 6 // 10
        ]
    with path.open("ab") as f:
        f.write(tail)

    report = cli(url, "verify")
    assert report.returncode == 4, report
    assert str(len(good)) in report.stdout + report.stderr, f"verify does not name byte offset {len(good)}"
    assert path.read_bytes() == good + tail, "plain verify changed the file"
    assert [e.position for e in read_log(url)] == [1, 2, 3, 4, 5], "a reader must see the complete events"

    repair = cli(url, "verify", "--repair")
    assert repair.returncode == 0, repair
    said = repair.stdout + repair.stderr
    assert str(len(tail)) in said or str(len(good)) in said, f"repair does not say what it dropped: {said!r}"
    assert path.read_bytes() == good, "repair must truncate exactly the torn tail"
    assert cli(url, "verify").returncode == 0

    # a writer repairs a torn tail too, and keeps every complete event
    with path.open("ab") as f:
        f.write(tail)
    more = append(url, "s", 1)
    assert (more[0].position, more[0].version) == (6, 6)
    assert path.read_bytes().startswith(good)
    envs = read_log(url)
    assert [e.position for e in envs] == [1, 2, 3, 4, 5, 6]
    assert_invariants(envs)
    assert cli(url, "verify").returncode == 0


def test_invalid_last_line_with_newline_is_damage_not_a_torn_tail(tmp_path: Path) -> None:
    """A complete line that does not decode is never cut (issue 9 item 8): only an unfinished write is."""
    url = url_for("ndjson", tmp_path)
    path = tmp_path / "log.ndjson"
    append(url, "s", 3)
    with path.open("ab") as f:
        f.write(b'{"position": 4, "stream": "s", "vers\n')
    damaged = path.read_bytes()
    report = cli(url, "verify")
    assert report.returncode == 4, report
    assert "line 4" in report.stdout + report.stderr
    repair = cli(url, "verify", "--repair")
    assert repair.returncode == 4, repair
    assert path.read_bytes() == damaged
    assert (
        cli(
            url, "append", "--stream", "goal-1", "--type", "goal.paused", "--data", '{"goal_id":"g1"}'
        ).returncode
        == 4
    )
    assert path.read_bytes() == damaged


# -- corrupt middle line --------------------------------------------------------------------------

CORRUPT: dict[str, Callable[[bytes], bytes]] = {
    "invalid json": lambda line: b'{"position": 3, "stream": "s", this is not json}\n',
    "wrong position": lambda line: line.replace(b'"position":3', b'"position":33'),
    "missing key": lambda line: line.replace(b'"event_id"', b'"event_ix"'),
    "bit flip in data": lambda line: line.replace(b'"data":{"i":2}', b'"data":{"i":2]'),
}


@pytest.mark.parametrize("flavour", list(CORRUPT))
def test_corrupt_middle_line_fails_reads_and_is_never_repaired(tmp_path: Path, flavour: str) -> None:
    url = url_for("ndjson", tmp_path)
    path = tmp_path / "log.ndjson"
    append(url, "s", 5)
    lines = path.read_bytes().splitlines(keepends=True)
    lines[2] = CORRUPT[flavour](lines[2])
    assert lines[2].endswith(b"\n")
    path.write_bytes(b"".join(lines))
    before = path.read_bytes()

    with pytest.raises(CorruptLogError) as info:
        read_log(url)
    assert info.value.line == 3
    assert "log.ndjson" in str(info.value)

    for args in (("verify",), ("verify", "--repair")):
        r = cli(url, *args)
        assert r.returncode == 4, r
        assert "3" in r.stdout + r.stderr
        assert path.read_bytes() == before, f"`{' '.join(args)}` changed a log with a corrupt middle line"

    # A writer need not re-read the whole log on open (a same-length in-place corruption keeps the index's
    # offsets valid), but it must never cut, rewrite or skip over the corrupt line: either it refuses, or
    # it appends after it and the line still fails every read.
    try:
        append(url, "s", 1)
    except StorageError:
        assert path.read_bytes() == before, "a refused append changed the log"
    else:
        assert path.read_bytes().startswith(before), "an append rewrote a log with a corrupt middle line"
        with pytest.raises(CorruptLogError) as again:
            read_log(url)
        assert again.value.line == 3
