"""The goal stream under construction, and the import's report of what it left out.

Folding as it appends (through :func:`loopd_es.domain.evolve.evolve`) lets every later step look at the
state the earlier ones produced, and lets an event that would not apply be left out and reported (with its
ledger line and the reducer's reason) instead of becoming an anomaly in the imported stream.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

import msgspec

from ..clock import parse_or_none
from ..domain.evolve import evolve, initial
from ..events import run as r
from ..events.imported import SkippedLine

if TYPE_CHECKING:
    from ..domain.state import GoalState
    from ..events.base import Event
    from .ledger import LedgerLine
    from .source import RefRuntime


class Emitted(msgspec.Struct, frozen=True):
    """One event for a stream: where it came from (``ledger:<line>`` or ``state:<what>``), when the source
    says it happened (``at``, read from ``at_from``), and its cause: the index of an earlier event of the
    same stream, an event id of another stream, or ``None`` (the import itself)."""

    payload: Event
    source: str
    at: str = ""
    at_from: str = ""
    cause: int | str | None = None


class Report:
    """What an import could not carry over: every ledger line it skipped, and other warnings."""

    def __init__(self) -> None:
        self.warnings: list[str] = []
        self.skipped: list[SkippedLine] = []

    def warn(self, text: str) -> None:
        self.warnings.append(text)

    def skip(self, subject: str, line: LedgerLine, reason: str) -> None:
        """Record that ``line`` did not become an event, and why (the CLI lists these on stdout)."""
        self.skipped.append(SkippedLine(line=line.line, type=line.type, reason=f"{subject}: {reason}"))


class When(TypedDict, total=False):
    """Keywords of :meth:`GoalBuilder.emit` saying when an event happened and where that time was read."""

    at: str
    at_from: str


class Sourced(When, total=False):
    """:class:`When` with the event's ``source``."""

    source: str


def from_line(line: LedgerLine) -> Sourced:
    """``source``/``at``/``at_from`` keywords for an event copied from a ledger line."""
    src = f"ledger:{line.line}"
    return {"source": src, "at": line.timestamp, "at_from": src}


def exact(line: LedgerLine, at: str | None, field: str) -> Sourced:
    """:func:`from_line`, timed by the state field ``field`` when it has a time: loopd stamps the ledger line
    a few milliseconds after the state write, and the state's value is the one its readers saw."""
    kw = from_line(line)
    return {**kw, "at": at, "at_from": field} if at else kw


class GoalBuilder:
    """Appends events while folding them, so each correction sees the state the earlier ones produced."""

    def __init__(self, goal_id: str, report: Report, gen_offset: int) -> None:
        self.goal_id = goal_id
        self.items: list[Emitted] = []
        self.state: GoalState = initial(goal_id)
        self.report = report
        self.gen_offset = gen_offset
        self.runs = 0
        self.run_starts: dict[str, int] = {}
        """Run id -> index of its ``run.started`` in :attr:`items` (the cause of the run's end)."""
        self.last_failure: int | None = None

    def emit(
        self,
        payload: Event,
        source: str,
        *,
        at: str = "",
        at_from: str = "",
        cause: int | str | None = None,
        line: LedgerLine | None = None,
    ) -> int | None:
        """Append ``payload`` if it applies; else report it (a ledger ``line`` as skipped) and return None."""
        after = evolve(self.state, payload)
        if after.anomaly_count > self.state.anomaly_count:
            reason = after.anomalies[-1].reason
            subject = f"goal {self.goal_id}"
            if line is not None:
                self.report.skip(subject, line, f"{payload.event_type} does not apply to the goal ({reason})")
            else:
                self.report.warn(
                    f"{subject}: {source} ({payload.event_type}) does not apply ({reason}); left out"
                )
            return None
        self.state = after
        self.items.append(Emitted(payload, source, at, at_from or (source if at else ""), cause))
        index = len(self.items) - 1
        if isinstance(payload, r.RunStarted):
            self.runs += 1
            self.run_starts[payload.run_id] = index
        elif isinstance(payload, r.RunFailed):
            self.last_failure = index
        return index

    def seed(self, item: Emitted) -> None:
        """Take an event the stream already holds (a mirror continuing it): fold it, no checks, no report."""
        self.state = evolve(self.state, item.payload)
        self.items.append(item)
        index = len(self.items) - 1
        if isinstance(item.payload, r.RunStarted):
            self.runs += 1
            self.run_starts[item.payload.run_id] = index
        elif isinstance(item.payload, r.RunFailed):
            self.last_failure = index

    def next_generation(self) -> int:
        return max(self.state.run_generation, self.gen_offset) + 1

    def current_run(self) -> int | None:
        """Index of the running run's ``run.started`` (what a worker tool call during it was caused by)."""
        run = self.state.active_run_id
        return self.run_starts.get(run) if run is not None else None


def start_run(
    b: GoalBuilder,
    rt: RefRuntime | None,
    run_id: str,
    turn: int,
    *,
    charged: bool,
    source: str,
    at: str = "",
    at_from: str = "",
    line: LedgerLine | None = None,
) -> int | None:
    """Start a run (the snapshot's lease and prompt id when it is the run the snapshot has in flight)."""
    active = rt is not None and rt.active_run_id == run_id and rt.phase == "running"
    return b.emit(
        r.RunStarted(
            goal_id=b.goal_id,
            run_id=run_id,
            generation=b.next_generation(),
            turn_count=turn,
            charged=charged,
            prompt_message_id=(rt.active_prompt_message_id or "") if active and rt else "",
            deadline=parse_or_none(rt.lease_expires_at if active and rt else None),
            at=parse_or_none(at),
        ),
        source,
        at=at,
        at_from=at_from,
        line=line,
    )
