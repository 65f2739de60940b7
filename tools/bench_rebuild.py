"""Benchmark ``projections rebuild``: every read model of ``projections.ALL`` over a realistic SQLite log.

    python tools/bench_rebuild.py                         # 1M events, 3 runs each, median
    python tools/bench_rebuild.py --events 100000 --runs 1   # a quick look

The log is what the engine writes, not filler: goals created, runs started and completed or failed with
usage accounted, provider limits with the model fallback, identity switches (deferred, applied, combined
ones rolled back) with their saga streams, progress reports, and command sessions with awaits, interleaved
across many goals. It is built with the catalogue's own payloads (:func:`new_event`) and written through the
store's bulk path (``import_envelopes``) in large batches, so building it costs seconds, not the fsyncs of
a million appends.

Prints one JSON document: the store's own read rate of the log (the ceiling one process cannot beat,
measured in the same run), then ``Projector.rebuild()`` into a fresh read database of all projections
together (``all``: on two cores, half of them in a worker process; ``all_one_process``: in this process
only) and of each alone, as events/s (median of ``--runs``), as a ratio to that read rate, and with the CPU
seconds of this process and of the worker: on a shared machine wall time overstates, and
``events_per_cpu_s`` (events over the busier process's CPU time) is what an idle machine would show.
Target: all together >= 150k events/s (issue #10).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import anyio
import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `projections` is not installed with loopd_es

from loopd_es.clock import parse_rfc3339
from loopd_es.events import command as c
from loopd_es.events import goal as g
from loopd_es.events import identity as i
from loopd_es.events import run as r
from loopd_es.events import saga as s
from loopd_es.events.catalogue import new_event
from loopd_es.events.envelope import Envelope
from loopd_es.log import LogStore, open_store
from loopd_es.projector import DEFAULT_REGISTRY, Projection, Projector, load_registry

if TYPE_CHECKING:
    from loopd_es.events.base import Event

TARGET = 150_000
MODELS = ("prov/m1", "prov/m2", "prov/m3", "prov/m4")
AGENTS = ("build", "plan", "review")
EPOCH = 1_796_205_600  # 2026-12-02T10:00:00Z


class LogWriter:
    """Turns (stream, payloads) into envelopes with gapless positions, stream versions and causal links."""

    def __init__(self) -> None:
        self.position = 0
        self.versions: dict[str, int] = {}
        self.pending: list[Envelope] = []
        self._second = -1
        self._stamp = ""

    def _now(self) -> str:
        """A recorded-at that advances 1 ms per event (cheap: one strftime per simulated second)."""
        ms = self.position
        second = EPOCH + ms // 1000
        if second != self._second:
            self._second = second
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._stamp}.{ms % 1000:03d}000Z"

    def add(self, stream: str, payloads: list[Event], correlation: str | None = None) -> None:
        version = self.versions.get(stream, 0)
        cause: str | None = None
        for payload in payloads:
            new = new_event(payload, causation_id=cause, correlation_id=correlation)
            self.position += 1
            version += 1
            self.pending.append(
                Envelope(
                    position=self.position, stream=stream, version=version, event_id=new.event_id,
                    type=new.type, schema_version=new.schema_version, recorded_at=self._now(),
                    causation_id=new.causation_id, correlation_id=new.correlation_id,
                    data=msgspec.Raw(new.data_bytes()),
                )
            )  # fmt: skip
            cause = new.event_id
        self.versions[stream] = version


class _Goal:
    """What the generator remembers of one goal to write plausible next events."""

    def __init__(self, goal_id: str, model: str) -> None:
        self.goal_id = goal_id
        self.stream = f"goal-{goal_id}"
        self.generation = 0
        self.model = model
        self.failures = 0
        self.switches = 0
        self.messages = 0


def _episode(w: LogWriter, rng: random.Random, goal: _Goal, commands: list[int]) -> None:
    """One plausible slice of a goal's life: mostly a run, sometimes a switch, a limit, or a command."""
    gid, stream, at = goal.goal_id, goal.stream, w._now()
    roll = rng.random()
    if roll < 0.80:  # a run: start, usage, idle candidate, completion (or a failure)
        goal.generation += 1
        gen, run_id = goal.generation, f"r{goal.generation}"
        goal.messages += 1
        events: list[Event] = [
            r.RunStarted(goal_id=gid, run_id=run_id, generation=gen, prompt_message_id=f"p{gen}",
                         turn_count=gen, at=parse_rfc3339(at)),
            g.GoalUsageAccounted(goal_id=gid, message_ids=(f"m{goal.messages}",),
                                 token_delta=rng.randint(100, 5000), cost_delta=0.001 * rng.randint(1, 50),
                                 time_delta_seconds=rng.random() * 30),
        ]  # fmt: skip
        if rng.random() < 0.85:
            goal.failures = 0
            events += [
                r.RunIdleCandidate(goal_id=gid, run_id=run_id, generation=gen, at=parse_rfc3339(at)),
                r.RunCompleted(goal_id=gid, run_id=run_id, generation=gen),
            ]
            if rng.random() < 0.3:
                events.append(g.GoalProgressReported(goal_id=gid, summary=f"step {gen} done",
                                                     next=f"step {gen + 1}", at=parse_rfc3339(at)))  # fmt: skip
        else:
            goal.failures += 1
            events.append(r.RunFailed(goal_id=gid, run_id=run_id, error="500 Internal Server Error",
                                      consecutive_failures=goal.failures))  # fmt: skip
        w.add(stream, events, correlation=f"run-{gid}-{gen}")
    elif roll < 0.85:  # a 429 on a run, the limit observed and the ordered fallback prepared
        goal.generation += 1
        gen, run_id = goal.generation, f"r{goal.generation}"
        goal.failures += 1
        fallback = MODELS[(MODELS.index(goal.model) + 1) % len(MODELS)]
        w.add(stream, [
            r.RunStarted(goal_id=gid, run_id=run_id, generation=gen, prompt_message_id=f"p{gen}", turn_count=gen),
            r.RunFailed(goal_id=gid, run_id=run_id, error="429 Too Many Requests",
                        consecutive_failures=goal.failures, retry_after=parse_rfc3339(at)),
            i.ProviderLimitObserved(goal_id=gid, kind="rate-limit", source="session-error", observed_at=parse_rfc3339(at),
                                    model=goal.model, status_code=429, retry_at=parse_rfc3339(at)),
            i.FallbackPrepared(goal_id=gid, model=fallback, attempted=(goal.model, fallback)),
        ], correlation=f"limit-{gid}-{gen}")  # fmt: skip
        _switch(w, rng, goal, fallback, None, reason="quota")
    elif roll < 0.91:  # an owner switch: applied now, or deferred and applied later, or rolled back
        model = rng.choice(MODELS)
        agent = rng.choice(AGENTS) if rng.random() < 0.3 else None
        if rng.random() < 0.3:
            goal.switches += 1
            w.add(stream, [i.IdentitySwitchDeferred(goal_id=gid, switch_id=f"{gid}-d{goal.switches}",
                                                    model=model)])  # fmt: skip
            _switch(w, rng, goal, model, None, reason="owner", pending=True)
        else:
            _switch(w, rng, goal, model, agent, reason="owner")
    elif roll < 0.97:  # the worker's own bookkeeping
        w.add(stream, [
            g.GoalInputQueued(goal_id=gid, input_id=f"in-{goal.messages}", text="also cover the CLI"),
            g.GoalProgressReported(goal_id=gid, summary="checkpoint", next="continue", at=parse_rfc3339(at)),
        ])  # fmt: skip
    else:  # a command session the goal waits on
        n = len(commands)
        commands.append(n)
        cid, cstream = f"c{n}", f"command-c{n}"
        ok = rng.random() < 0.8
        w.add(cstream, [
            c.CommandStarted(command_id=cid, title="build", command="make", args=["all"], cwd="/w",
                             watch=c.WatchSpec(filter="ERROR", until="done"), goal_id=gid, started_at=parse_rfc3339(at)),
            c.CommandSpawned(command_id=cid, pid=1000 + n, supervisor_pid=999),
            c.AwaitRequested(goal_id=gid, command_id=cid, until="done"),
            c.WatchMatched(command_id=cid, lines=3, matches=1, pushes=1),
            c.CommandExited(command_id=cid, status="exited", end_reason="exit", exit_code=0 if ok else 2,
                            ended_at=parse_rfc3339(at)),
            c.AwaitFired(goal_id=gid, command_id=cid, status="exited", exit_code=0 if ok else 2,
                         until="done", matched_lines=["done"], evidence="done"),
        ], correlation=f"cmd-{cid}")  # fmt: skip


def _switch(
    w: LogWriter, rng: random.Random, goal: _Goal, model: str, agent: str | None, *, reason: str,
    pending: bool = False,
) -> None:  # fmt: skip
    """A switch request, its saga stream (host calls), and its outcome on the goal stream."""
    gid, stream = goal.goal_id, goal.stream
    goal.switches += 1
    sw = f"{gid}-s{goal.switches}"
    corr = f"switch-{sw}"
    by = "pending" if pending or reason == "quota" else "owner-1"
    w.add(stream, [i.IdentitySwitchRequested(goal_id=gid, switch_id=sw, model=model, agent=agent,
                                             pending=pending or reason == "quota", reason=reason,  # type: ignore[arg-type]
                                             requested_by=by)], correlation=corr)  # fmt: skip
    saga: list[Event] = [s.SwitchSagaStarted(switch_id=sw, goal_id=gid, session_id="ses-1", from_model=goal.model,
                                             from_agent="build")]  # fmt: skip
    key = f"{sw}/forward/switch_model"
    saga += [s.HostCallIntended(switch_id=sw, key=key, op="switch_model", arg=model, purpose="forward"),
             s.HostCallSucceeded(switch_id=sw, key=key, result="applied")]  # fmt: skip
    rolled = agent is not None and rng.random() < 0.4
    if agent is not None:
        akey = f"{sw}/forward/switch_agent"
        saga.append(
            s.HostCallIntended(switch_id=sw, key=akey, op="switch_agent", arg=agent, purpose="forward")
        )
        if rolled:
            bkey = f"{sw}/compensate/switch_model"
            saga += [s.HostCallFailed(switch_id=sw, key=akey, reason="rejected"),
                     s.HostCallIntended(switch_id=sw, key=bkey, op="switch_model", arg=goal.model,
                                        purpose="compensate"),
                     s.HostCallSucceeded(switch_id=sw, key=bkey, result="applied")]  # fmt: skip
        else:
            saga.append(s.HostCallSucceeded(switch_id=sw, key=akey, result="applied"))
    saga.append(
        s.SwitchSagaFinished(switch_id=sw, goal_id=gid, outcome="rolled-back" if rolled else "applied")
    )
    w.add(f"switch-{sw}", saga, correlation=corr)
    if rolled:
        w.add(stream, [
            i.IdentitySwitchFailed(goal_id=gid, switch_id=sw, target="identity", stage="host", reason="host-rejected"),
            i.IdentitySwitchRolledBack(goal_id=gid, switch_id=sw, model=goal.model, agent="build"),
        ], correlation=corr)  # fmt: skip
        return
    target: Literal["model", "identity"] = "identity" if agent is not None else "model"
    w.add(stream, [i.IdentitySwitchApplied(goal_id=gid, switch_id=sw, target=target, to_model=model,
                                           to_agent=agent, from_model=goal.model, reason=reason)],  # type: ignore[arg-type]
          correlation=corr)  # fmt: skip
    goal.model = model


def generate(events: int, active: int, seed: int, batch: int = 50_000) -> Iterator[list[Envelope]]:
    """``events`` envelopes, ``batch`` at a time, over ``active`` goals at work at once.

    Each goal lives for a random number of episodes (a few hundred to a few thousand events), then is
    completed (and sometimes cleared) and a new goal takes its place, as on a busy engine.
    """
    rng = random.Random(seed)
    w = LogWriter()
    live: list[tuple[_Goal, list[int]]] = []  # each goal with its episodes left
    commands: list[int] = []
    made = 0
    while w.position < events:
        if len(live) < active:
            gid = f"{rng.getrandbits(32):08x}-goal-{made}"
            made += 1
            model = rng.choice(MODELS)
            config = g.GoalConfig(model=model, agent="build", fallback_models=MODELS, token_budget=10**9,
                                  cost_budget=1e6, timeout_ms=600_000)  # fmt: skip
            goal = _Goal(gid, model)
            w.add(goal.stream, [
                g.GoalCreated(goal_id=gid, name=f"goal {made}", objective="keep the docs in shape",
                              owner_session_id="owner-1", config=config, at=parse_rfc3339(w._now())),
                g.GoalWorkerAssigned(goal_id=gid, worker_session_id=f"ses-{made}"),
            ])  # fmt: skip
            live.append((goal, [rng.randint(50, 600)]))
        else:
            k = rng.randrange(len(live))
            goal, left = live[k]
            _episode(w, rng, goal, commands)
            left[0] -= 1
            if left[0] <= 0:
                done: list[Event] = [g.GoalCompleted(goal_id=goal.goal_id, summary="done", evidence="checks pass",
                                                     at=parse_rfc3339(w._now()))]  # fmt: skip
                if rng.random() < 0.3:
                    done.append(g.GoalCleared(goal_id=goal.goal_id))
                w.add(goal.stream, done)
                live[k] = live[-1]
                live.pop()
        if len(w.pending) >= batch or w.position >= events:
            out, w.pending = [e for e in w.pending if e.position <= events], []
            yield out


async def make_log(url: str, events: int, active: int, seed: int) -> tuple[float, dict[str, int]]:
    """Write the log through the store's bulk import; returns seconds taken and events per type family."""
    families: dict[str, int] = {}

    async def batches() -> AsyncIterator[list[Envelope]]:
        for batch in generate(events, active, seed):
            for env in batch:
                family = env.type.split(".", 1)[0]
                families[family] = families.get(family, 0) + 1
            yield batch

    started = time.perf_counter()
    async with await open_store(url) as store:
        await store.import_envelopes(batches())
    return time.perf_counter() - started, families


async def read_rate(store: LogStore) -> float:
    started = time.perf_counter()
    count = 0
    async for batch in store.read_batches():
        count += len(batch)
    return count / (time.perf_counter() - started)


def _remove_db(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


class Timing(NamedTuple):
    """One rebuild: wall seconds, and the CPU seconds of this process and of its worker (if any)."""

    wall: float
    cpu: float
    worker_cpu: float

    def rate(self, events: int) -> float:
        return events / self.wall

    def cpu_rate(self, events: int) -> float:
        """Events/s were each process alone on a core: the machine is shared, so wall time overstates."""
        return events / max(self.cpu, self.worker_cpu)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def rebuild_timing(
    store: LogStore, projections: list[Projection], read_db: Path, *, parallel: bool | None = None
) -> Timing:
    """``Projector.rebuild()`` into a fresh read database (opening it is not timed)."""
    _remove_db(read_db)
    async with await Projector.open(store, projections, read_db) as projector:
        started, cpu, children = time.perf_counter(), time.process_time(), _children_cpu()
        await projector.rebuild(parallel=parallel)
        return Timing(time.perf_counter() - started, time.process_time() - cpu, _children_cpu() - children)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "params": {
            "registry": args.registry,
            "events": args.events,
            "active_goals": args.active,
            "runs": args.runs,
            "seed": args.seed,
        },
    }
    registry = load_registry(args.registry)
    selected = [p for p in registry if not args.only or p.name in args.only.split(",")]
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        url = f"sqlite:{root / 'log.db'}"
        seconds, families = await make_log(url, args.events, args.active, args.seed)
        result["log"] = {"seconds_to_write": round(seconds, 1), "events_by_family": families}
        async with await open_store(url) as store:
            reads = [await read_rate(store) for _ in range(args.runs)]
            read = statistics.median(reads)
            result["store_read_events_per_s"] = round(read)
            figures: dict[str, Any] = {}
            groups: list[tuple[str, list[Projection], bool | None]] = []
            if len(selected) > 1:
                groups += [("all", selected, None), ("all_one_process", selected, False)]
            groups += [(p.name, [p], False) for p in selected] if not args.all_only else []
            for label, projections, parallel in groups:
                timings = [
                    await rebuild_timing(store, projections, root / "read.db", parallel=parallel)
                    for _ in range(args.runs)
                ]
                rate = statistics.median(t.rate(args.events) for t in timings)
                figures[label] = {
                    "events_per_s": round(rate),
                    "runs": [round(t.rate(args.events)) for t in timings],
                    "ratio_to_store_read": round(rate / read, 3),
                    "cpu_s": [round(t.cpu, 2) for t in timings],
                    "worker_cpu_s": [round(t.worker_cpu, 2) for t in timings],
                    "events_per_cpu_s": round(statistics.median(t.cpu_rate(args.events) for t in timings)),
                }
            result["rebuild"] = figures
    if "all" in result["rebuild"]:
        rate = result["rebuild"]["all"]["events_per_s"]
        result["target"] = f"all projections >= {TARGET} events/s"
        result["pass"] = rate >= TARGET
        result["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--events", type=int, default=1_000_000, help="events in the log (default 1M)")
    parser.add_argument("--active", type=int, default=64, help="goals at work at once (default 64)")
    parser.add_argument("--runs", type=int, default=3, help="rebuilds per figure; the median is reported")
    parser.add_argument("--only", default="", help="comma-separated projection names (default: all)")
    parser.add_argument(
        "--all-only", action="store_true", help="time all projections together, not each alone"
    )
    parser.add_argument(
        "--registry", default=DEFAULT_REGISTRY, help="module whose ALL is measured (default: projections)"
    )
    parser.add_argument("--seed", type=int, default=5, help="seed of the generated log")
    parser.add_argument("--dir", default=None, help="where to put the temporary logs (default: $TMPDIR)")
    args = parser.parse_args()
    result = anyio.run(run, args)
    print(json.dumps(result, indent=2))
    return 0 if result.get("pass", True) else 1


if __name__ == "__main__":
    raise SystemExit(main())
