"""Rebuilding read models on two cores: half of them in a worker process, adopted into the read db at the end.

A rebuild is CPU-bound Python (decoding and folding events) plus SQLite writes, and SQLite takes one writer
at a time, so two processes writing one file would mostly wait on each other. Instead the worker rebuilds
its share (:func:`~.runner.rebuild_part`) into a read database of its own (a sibling file), in parallel with
this process rebuilding the other share into the real one; then :meth:`ReadDb.adopt <loopd_es.projector.readdb.ReadDb.adopt>` copies its
tables in, in one transaction, as bulk inserts in key order into empty tables. The rows are the same the
projections would have written here: each projection still sees every event in order, only elsewhere.

The split balances each projection's ``rebuild_cost`` (an optional attribute: relative cost per event,
default 1) and keeps projections that share work (the same ``rebuild_affinity``, e.g. the goal models
sharing one fold per event) in the same process.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Final

import anyio

from .base import ProjectionError

if TYPE_CHECKING:
    from .base import Projection

PARALLEL_MIN_EVENTS: Final = 50_000
"""Below this many events a worker's start-up (~0.3 s to import and open) costs more than it saves."""
PARALLEL_SCHEMES: Final = ("sqlite:", "ndjson:")
"""Logs another process can open by URL and that the tests rebuild in parallel (an in-memory log cannot be
opened elsewhere; PostgreSQL could be, once tested)."""


def cost(projection: Projection) -> float:
    value = getattr(projection, "rebuild_cost", 1.0)
    return float(value) if isinstance(value, int | float) and value > 0 else 1.0


def split(projections: Sequence[Projection]) -> tuple[list[Projection], list[Projection]] | None:
    """Two shares of about equal cost, or None when there is nothing to split: (kept here, for the worker).

    The heavier share goes to the worker, as this process also copies the worker's tables in at the end.

    Projections with the same ``rebuild_affinity`` stay together; the groups go, heaviest first, to the
    lighter share (the longest-processing-time rule).
    """
    groups: dict[object, list[Projection]] = {}
    for projection in projections:
        key = getattr(projection, "rebuild_affinity", None) or ("alone", projection.name)
        groups.setdefault(key, []).append(projection)
    if len(groups) < 2:
        return None
    shares: tuple[list[Projection], list[Projection]] = ([], [])
    totals = [0.0, 0.0]
    for group in sorted(groups.values(), key=lambda g: -sum(cost(p) for p in g)):
        k = 0 if totals[0] <= totals[1] else 1
        shares[k].extend(group)
        totals[k] += sum(cost(p) for p in group)
    order = {p.name: i for i, p in enumerate(projections)}  # registry order within each share
    here, there = (sorted(s, key=lambda p: order[p.name]) for s in shares)
    return (here, there) if totals[0] <= totals[1] else (there, here)


@contextmanager
def relaxed_gc(threshold: int = 50_000) -> Iterator[None]:
    """Run the cyclic garbage collector's youngest generation every ``threshold`` allocations, not every 700.

    A rebuild allocates millions of short-lived, acyclic objects (envelopes, payloads, rows) that reference
    counting frees; the collector's frequent passes over them found nothing and cost 5-10% of the CPU
    (tools/bench_rebuild.py). The previous thresholds come back afterwards.
    """
    before = gc.get_threshold()
    gc.set_threshold(max(before[0], threshold), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


def portable(projections: Sequence[Projection]) -> bool:
    """Whether ``projections`` can travel to a worker process (pickled: a class defined in a function cannot)."""
    import pickle  # here: a one-shot query loads this module but never rebuilds

    try:
        pickle.dumps(list(projections))
    except (pickle.PicklingError, TypeError, AttributeError):
        return False
    return True


def part_path(read_db: Path) -> Path:
    """Where the worker builds its share: beside the read database (same file system, so same speed)."""
    return read_db.with_name(f"{read_db.name}.rebuild-part")


def remove_db(path: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


_WORKER: Final = "from loopd_es.projector.worker import main; main()"


async def run_part(url: str, projections: Sequence[Projection], path: Path) -> tuple[dict[str, int], int]:
    """Run :func:`~.runner.rebuild_part` in a new Python process (the projections travel pickled).

    A fresh interpreter started with ``-c`` (not multiprocessing's spawn): it never re-imports the caller's
    ``__main__``. Cancelling this kills the worker.

    :raises ProjectionError: when the worker fails (its last line of stderr says why).
    """
    import pickle

    request = pickle.dumps(sys.path) + pickle.dumps((url, list(projections), str(path)))
    result = await anyio.run_process([sys.executable, "-c", _WORKER], input=request, check=False)
    if result.returncode != 0:
        lines = result.stderr.decode(errors="replace").strip().splitlines() or ["no output"]
        raise ProjectionError(f"the parallel rebuild worker failed (exit {result.returncode}): {lines[-1]}")
    answer: tuple[dict[str, int], int] = pickle.loads(result.stdout)
    return answer
