"""The goal stream under construction: events appended while folding, and the runs the ledger lost.

Folding as it appends (through :func:`loopd_es.domain.evolve.evolve`) lets every later step look at the
state the earlier ones produced, and lets an event that would not apply be left out and reported instead
of becoming an anomaly in the imported stream.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from ..domain.evolve import evolve, initial
from ..events import run as r

if TYPE_CHECKING:
    from ..domain.state import GoalState
    from ..events.base import Event
    from .source import RefRuntime


class Emitted(msgspec.Struct, frozen=True):
    """One event for a stream and where it came from: ``ledger:<line>`` or ``state:<what>``."""

    payload: Event
    source: str


class GoalBuilder:
    """Appends events while folding them, so each correction sees the state the earlier ones produced."""

    def __init__(self, goal_id: str, warnings: list[str], gen_offset: int, charged_synth: int | None) -> None:
        self.goal_id = goal_id
        self.items: list[Emitted] = []
        self.state: GoalState = initial(goal_id)
        self.warnings = warnings
        self.gen_offset = gen_offset
        self.charged_synth = charged_synth
        self.runs = 0
        self.synth_runs: list[int] = []

    def emit(self, payload: Event, source: str) -> bool:
        after = evolve(self.state, payload)
        if after.anomaly_count > self.state.anomaly_count:
            reason = after.anomalies[-1].reason
            self.warnings.append(
                f"goal {self.goal_id}: {source} ({payload.event_type}) does not apply ({reason}); left out"
            )
            return False
        self.state = after
        self.items.append(Emitted(payload, source))
        if isinstance(payload, r.RunStarted):
            self.runs += 1
        return True

    def next_generation(self) -> int:
        return max(self.state.run_generation, self.gen_offset) + 1


def start_run(
    b: GoalBuilder, rt: RefRuntime | None, run_id: str, turn: int, *, charged: bool, at: str, source: str
) -> None:
    active = rt is not None and rt.active_run_id == run_id
    b.emit(
        r.RunStarted(
            goal_id=b.goal_id,
            run_id=run_id,
            generation=b.next_generation(),
            turn_count=turn,
            charged=charged,
            prompt_message_id=(rt.active_prompt_message_id or "") if active and rt else "",
            lease_expires_at=rt.lease_expires_at if active and rt else None,
            at=at,
        ),
        source,
    )


def fill_turns(b: GoalBuilder, rt: RefRuntime | None, upto: int, *, final: bool) -> None:
    """Synthesise the runs the ledger lost, turns ``run_count + 1 .. upto - 1`` (a ledger gap or the tail).

    Runs are closed, except the last one of the tail when the snapshot has that run in flight.
    """
    first = b.state.run_count + 1
    for turn in range(first, upto):
        index = len(b.synth_runs)
        b.synth_runs.append(turn)
        charged = b.charged_synth is None or index < b.charged_synth
        last = final and turn == upto - 1
        open_run = last and rt is not None and rt.phase == "running" and rt.active_run_id is not None
        run_id = rt.active_run_id if open_run and rt and rt.active_run_id else f"imported-turn-{turn}"
        start_run(b, rt, run_id, turn, charged=charged, at="", source=f"state:runtime.runCount#{turn}")
        if not open_run:
            b.emit(
                r.RunCompleted(goal_id=b.goal_id, run_id=run_id, generation=b.state.run_generation),
                f"state:runtime.runCount#{turn}.completed",
            )
