"""Where an engine turn's time goes: the steps between a worker's idle and the next prompt, timed inside
``loopd-es run``.

``tools/bench_opencode.py --breakdown`` starts the engine with :func:`engine_env`, which puts a
``sitecustomize`` on its ``PYTHONPATH``. That module wraps a few engine methods (getting the transcript: the
host's stream mirror of it, or a read when the mirror cannot vouch; the decision and its commit, the prompt's building and its HTTP call) with timers that append one line per call
to a file: ``name start end`` in ``time.perf_counter`` seconds. :func:`breakdown` then reads the file back and
summarises the idle signals that sent a prompt, step by step. Profiling only: nothing here is imported by
loopd-es itself.
"""

from __future__ import annotations

import statistics
from pathlib import Path

SITECUSTOMIZE = """
import functools, os, time

_out = open(os.environ["LOOPD_ES_TURN_TRACE"], "a", buffering=1)


def _timed(cls, name, label):
    fn = getattr(cls, name)

    @functools.wraps(fn)
    async def timed(*args, **kwargs):
        started = time.perf_counter()
        try:
            return await fn(*args, **kwargs)
        finally:
            _out.write(f"{label} {started:.6f} {time.perf_counter():.6f}\\n")

    setattr(cls, name, timed)


from loopd_es.app.service import GoalService
from loopd_es.app.turns import TurnStarter
from loopd_es.engine.idle import IdleGate
from loopd_es.host.opencode import OpenCodeHost

_timed(IdleGate, "on_idle", "on_idle")
_timed(IdleGate, "transcript", "transcript")
_timed(GoalService, "execute_chain", "decide_and_commit")
_timed(TurnStarter, "send", "send")
_timed(OpenCodeHost, "prompt", "prompt")
"""


def engine_env(directory: Path, trace: Path, pythonpath: str) -> dict[str, str]:
    """The environment additions that make an engine started with them trace its turns into ``trace``."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return {"LOOPD_ES_TURN_TRACE": str(trace), "PYTHONPATH": f"{directory}:{pythonpath}"}


def _summary(values_s: list[float]) -> dict[str, float]:
    ms = sorted(v * 1000 for v in values_s)
    if not ms:
        return {"n": 0}
    return {
        "p50_ms": round(statistics.median(ms), 2),
        "p90_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.9))], 2),
        "n": len(ms),
    }


def breakdown(trace: Path) -> dict[str, dict[str, float]]:
    """Per idle signal that sent the next prompt: from the signal reaching the idle gate to the transcript
    (``transcript_read``: from the stream mirror, or read), the decision and its commit, from there to the prompt's HTTP call starting (building the
    prompt, the lease check), and the whole span to that call. The HTTP call itself is OpenCode's time."""
    rows: list[tuple[str, float, float]] = []
    for line in trace.read_text().splitlines():
        label, begun, ended = line.split()
        rows.append((label, float(begun), float(ended)))
    steps: dict[str, list[float]] = {
        "idle_to_transcript_read": [],
        "transcript_read": [],
        "decide_and_commit": [],
        "commit_to_prompt_call": [],
        "idle_to_prompt_call": [],
    }
    for name, start, end in rows:
        if name != "on_idle":
            continue
        inner = sorted(
            (r for r in rows if r[0] != "on_idle" and start <= r[1] and r[2] <= end), key=lambda r: r[1]
        )
        prompt = next((r for r in inner if r[0] == "prompt"), None)
        chain = next((r for r in inner if r[0] == "decide_and_commit"), None)
        read = next((r for r in inner if r[0] == "transcript"), None)
        if prompt is None or chain is None:
            continue  # staged, confirmed without a plain next turn, or nothing to do
        if read is not None:
            steps["idle_to_transcript_read"].append(read[1] - start)
            steps["transcript_read"].append(read[2] - read[1])
        steps["decide_and_commit"].append(chain[2] - chain[1])
        steps["commit_to_prompt_call"].append(prompt[1] - chain[2])
        steps["idle_to_prompt_call"].append(prompt[1] - start)
    return {name: _summary(values) for name, values in steps.items()}
