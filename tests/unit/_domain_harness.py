"""A tiny in-memory goal for decider/reducer tests: decide, then evolve, no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import count
from typing import TYPE_CHECKING, Any

from loopd_es.domain import goal_commands as c
from loopd_es.domain.decide import decide
from loopd_es.domain.evolve import evolve, initial
from loopd_es.events.goal import GoalWorkerAssigned

if TYPE_CHECKING:
    from loopd_es.domain.state import GoalState
    from loopd_es.events.base import Event

T0 = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)
OWNER = "owner-1"

CATALOG = c.ModelCatalog(models={m: c.ModelInfo(usable=True) for m in ("p/old", "p/new", "p/last")})
AGENTS = c.AgentCatalog(agents=("old", "new", "last"))


@dataclass
class Goal:
    """One goal under test: its state, the events it produced, and the facts of its world."""

    goal_id: str = "g1"
    facts: c.Facts = field(
        default_factory=lambda: c.Facts(now=T0, model_catalog=CATALOG, agent_catalog=AGENTS)
    )
    state: GoalState = field(init=False)
    log: list[Event] = field(default_factory=list)
    _ids: Any = field(default_factory=lambda: count(1))

    def __post_init__(self) -> None:
        self.state = initial(self.goal_id)

    def do(self, command: Any, **facts: Any) -> list[Event]:
        f = self.facts if not facts else _with(self.facts, **facts)
        events = decide(command, self.state, f)
        for event in events:
            self.state = evolve(self.state, event)
        self.log.extend(events)
        return events

    def apply(self, *events: Event) -> None:
        for event in events:
            self.state = evolve(self.state, event)
            self.log.append(event)

    def next_id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._ids)}"

    def tick(self, seconds: float) -> None:
        self.facts = _with(self.facts, now=self.facts.now + timedelta(seconds=seconds))

    # -- common sequences ---------------------------------------------------------------------------

    def create(self, **args: Any) -> list[Event]:
        base: dict[str, Any] = {
            "goal_id": self.goal_id,
            "name": "g",
            "objective": "o",
            "owner_session_id": OWNER,
        }
        base.update(args)
        return self.do(c.CreateGoal(**base))

    def start(self, **args: Any) -> None:
        """Create, assign a worker and acquire the first turn, as the reference's ``start`` does."""
        self.create(**args)
        self.apply(GoalWorkerAssigned(goal_id=self.goal_id, worker_session_id="W"))
        self.turn()

    def turn(self, kind: Any = "steer") -> list[Event]:
        return self.do(
            c.StartRun(
                goal_id=self.goal_id,
                run_id=self.next_id("run"),
                prompt_message_id=f"msg_{self.next_id('p')}",
                kind=kind,
            )
        )

    def idle(self) -> None:
        """The reference's test helper "idle": phase idle, run cleared."""
        st = self.state
        if st.active_run_id is not None:
            self.do(
                c.ConfirmIdle(goal_id=self.goal_id, run_id=st.active_run_id, generation=st.run_generation)
            )

    def types(self) -> list[str]:
        return [e.event_type for e in self.log]


def _with(facts: c.Facts, **changes: Any) -> c.Facts:
    import msgspec

    return msgspec.structs.replace(facts, **changes)
