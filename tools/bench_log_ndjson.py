"""NDJSON figures of ``tools/bench_log.py`` (issue 9): scaling with the log's size, the minimal Python writer
beside the store's batches, writer processes, and the per-event CPU profile.

    python tools/bench_log.py --backends ndjson --figures f_scaling g_processes h_profile

Every figure is measured in the run that prints it; nothing here is a constant.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import msgspec

from loopd_es.clock import now_rfc3339
from loopd_es.events.envelope import ENVELOPE_ENCODER, Envelope, NewEvent
from loopd_es.log import open_store

PAYLOAD = {"goal_id": "g-000123", "summary": "s" * 120, "turn": 7}
TYPE = "goal.progress"
PROBE_EVENTS = 10


def _event(i: int) -> NewEvent:
    return NewEvent(type=TYPE, data={**PAYLOAD, "turn": i})


def minimal_writer(path: Path, n: int, size: int) -> float:
    """Events/s of the least a Python writer of the store's bytes does: build each envelope, encode it, join
    the lines, one ``write`` and one ``fdatasync`` per batch of ``size``."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        batches = [[_event(i + k) for k in range(size)] for i in range(0, n, size)]
        encode = ENVELOPE_ENCODER.encode
        t = time.perf_counter()
        position = 0
        for batch in batches:
            recorded_at = now_rfc3339()
            lines = []
            for new in batch:
                position += 1
                env = Envelope(
                    position, "bench-0", position, new.event_id, new.type, new.schema_version, recorded_at,
                    new.causation_id, new.correlation_id, msgspec.Raw(new.data_bytes()),
                )  # fmt: skip
                lines.append(encode(env))
            os.write(fd, b"\n".join(lines) + b"\n")
            os.fdatasync(fd)
        return len(batches) * size / (time.perf_counter() - t)
    finally:
        os.close(fd)
        path.unlink()


# -- (f) scaling with the log's size ----------------------------------------------------------------


async def _build(url: str, total: int) -> None:
    """``total`` events in 1000-event batches over many streams, plus a ``probe`` stream of
    :data:`PROBE_EVENTS` events spread over the whole log."""
    async with await open_store(url) as store:
        every = max(1, total // PROBE_EVENTS)
        written = 0
        probe = 0
        s = 0
        while written < total:
            if written // every >= probe and probe < PROBE_EVENTS:
                await store.append("probe", [_event(probe)], probe)
                probe += 1
                written += 1
                continue
            size = min(1000, total - written, every - written % every)
            await store.append(f"stream-{s:05d}", [_event(k) for k in range(size)])
            written += size
            s += 1


async def _one_size(url: str) -> dict[str, float]:
    t = time.perf_counter()
    store = await open_store(url)
    opened = time.perf_counter()
    try:
        n = 0
        async for _ in store.read_stream("probe"):
            n += 1
        streamed = time.perf_counter()
        assert n == PROBE_EVENTS, n
        head = await store.head()
        t2 = time.perf_counter()
        got = [e async for e in store.read_all(head // 2, limit=1)]
        bounded = time.perf_counter() - t2
        assert len(got) == 1
        t3 = time.perf_counter()
        await store.append(f"new-{uuid.uuid4().hex[:8]}", [_event(0)])
        first_append = time.perf_counter() - t3
    finally:
        await store.aclose()
    return {
        "open_ms": (opened - t) * 1000,
        "open_and_read_10_event_stream_ms": (streamed - t) * 1000,
        "read_all_limit_1_ms": bounded * 1000,
        "first_append_after_open_ms": first_append * 1000,
    }


def _cli_append(url: str) -> float:
    t = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "loopd_es", "--store", url.split("?", 1)[0], "append", "--stream",
         f"goal-{uuid.uuid4().hex[:8]}", "--type", "goal.paused", "--data", '{"goal_id":"g1"}'],
        check=True, capture_output=True,
    )  # fmt: skip
    return (time.perf_counter() - t) * 1000


def scaling(base: Path, sizes: list[int], runs: int) -> dict[str, Any]:
    """Per log size: open, a 10-event stream, ``read_all(limit=1)``, the first append, a CLI append (ms)."""
    out: dict[str, Any] = {}
    for total in sizes:
        url = f"ndjson:{base / f'scale-{total}-{uuid.uuid4().hex}.ndjson'}?durability=none"
        t = time.perf_counter()
        anyio.run(_build, url, total)
        build = time.perf_counter() - t
        plain = url.split("?", 1)[0]
        samples = [anyio.run(_one_size, plain) for _ in range(runs)]
        row: dict[str, Any] = {k: round(statistics.median(s[k] for s in samples), 3) for k in samples[0]}
        row["cli_append_ms"] = round(statistics.median(_cli_append(plain) for _ in range(runs)), 1)
        row["build_seconds"] = round(build, 1)
        out[str(total)] = row
    first, last = str(sizes[0]), str(sizes[-1])
    out["cli_append_ratio_largest_to_smallest"] = round(
        out[last]["cli_append_ms"] / out[first]["cli_append_ms"], 3
    )
    out["targets"] = {
        "read a 10-event stream at the largest size": "<= 1 ms",
        "first append after open at the largest size": "<= 10 ms",
        "CLI append, largest vs smallest": "<= 1.2x",
    }
    big = out[last]
    out["pass"] = {
        "stream": big["open_and_read_10_event_stream_ms"] - big["open_ms"] <= 1.0,
        "first_append": big["first_append_after_open_ms"] <= 10.0,
        "cli_append": out["cli_append_ratio_largest_to_smallest"] <= 1.2,
    }
    return out


# -- (g) writer processes ---------------------------------------------------------------------------

_WRITER = """
import sys, time, anyio
from loopd_es.events.envelope import NewEvent
from loopd_es.log import open_store

async def main(url, n, name):
    async with await open_store(url) as store:
        await store.append(name, [NewEvent(type="goal.progress", data={"i": -1})])
        go = float(sys.argv[4])
        while time.time() < go:
            time.sleep(0.001)
        for i in range(n):
            await store.append(name, [NewEvent(type="goal.progress", data={"i": i})])

anyio.run(main, sys.argv[1], int(sys.argv[2]), sys.argv[3])
"""

_RAW = """
import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
line = b"x" * int(sys.argv[3]) + b"\\n"
go = float(sys.argv[4])
while time.time() < go:
    time.sleep(0.001)
for _ in range(int(sys.argv[2])):
    os.write(fd, line)
    os.fdatasync(fd)
"""


def _processes(script: str, args: list[str], count: int, n: int) -> float:
    go = time.time() + 1.0  # every process has started and opened the log before the clock starts
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, *args, f"w{i}" if script is _WRITER else "400", str(go)]
        )
        for i in range(count)
    ]
    for p in procs:
        if p.wait() != 0:
            raise RuntimeError(f"a writer process failed with {p.returncode}")
    return count * n / (time.time() - go)


def processes(base: Path, n: int, runs: int) -> dict[str, Any]:
    """Durable single-event appends/s of 1 and of 4 writer processes on one log, beside raw fdatasync ones."""
    out: dict[str, Any] = {}
    for label, script in (("store", _WRITER), ("raw_fdatasync", _RAW)):
        for count in (1, 4):
            values = []
            for _ in range(runs):
                path = base / f"procs-{uuid.uuid4().hex}.ndjson"
                target = f"ndjson:{path}" if script is _WRITER else str(path)
                values.append(_processes(script, [target, str(n // count)], count, n // count))
            out[f"{label}_{count}"] = round(statistics.median(values), 1)
        out[f"{label}_ratio_4_to_1"] = round(out[f"{label}_4"] / out[f"{label}_1"], 3)
    out["target"] = "store 4 processes >= 1.5x one"
    out["pass"] = out["store_ratio_4_to_1"] >= 1.5
    return out


# -- (h) the per-event CPU profile ------------------------------------------------------------------


async def _store_cpu(url: str, n: int, size: int) -> float:
    async with await open_store(url) as store:
        await store.append("warm-up", [_event(0)])
        batches = [[_event(i + k) for k in range(size)] for i in range(0, n, size)]
        t = time.process_time()
        for b, batch in enumerate(batches):
            await store.append("bench-0", batch, b * size)
        return (time.process_time() - t) / n * 1e6


def _minimal_cpu(path: Path, n: int, size: int) -> float:
    t = time.process_time()
    minimal_writer(path, n, size)
    return (time.process_time() - t) / n * 1e6


def profile(base: Path, runs: int) -> dict[str, Any]:
    """CPU microseconds per event (process time, so neighbours' load does not count) of the store and of the
    minimal writer, for single events and 100-event batches; fdatasync's own time is I/O wait, not CPU."""
    out: dict[str, Any] = {}
    for size, n in ((1, 2000), (100, 20_000)):
        store = statistics.median(
            anyio.run(_store_cpu, f"ndjson:{base / f'cpu-{uuid.uuid4().hex}.ndjson'}", n, size)
            for _ in range(runs)
        )
        minimal = statistics.median(
            _minimal_cpu(base / f"min-{uuid.uuid4().hex}", n, size) for _ in range(runs)
        )
        out[f"batch_{size}"] = {
            "store_cpu_us_per_event": round(store, 2),
            "minimal_writer_cpu_us_per_event": round(minimal, 2),
            "store_extra_us_per_event": round(store - minimal, 2),
        }
    return out
