"""``whatif`` and ``replay --check`` over a log: read each goal's stream, re-decide it, add the results up.

The reading is the only I/O; :mod:`.redecide` does the rest. ``check`` is a what-if under the recorded policy:
any decision the current deciders would make differently is a failure naming the goal, the event and the field.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from ..domain.streams import GOAL_PREFIX
from .redecide import GoalReplay, replay_goal_events

if TYPE_CHECKING:
    from ..events.envelope import Envelope
    from ..log.base import LogStore
    from .policy import Policy


class Totals(msgspec.Struct, kw_only=True):
    """What a changed policy does over every goal replayed."""

    goals: int = 0
    unchanged: int = 0
    stop_earlier: int = 0
    run_longer: int = 0
    differ: int = 0
    saved_turns: int = 0
    saved_tokens: int = 0
    saved_cost: float = 0.0

    def sentence(self, policy: str) -> str:
        """``with max_turns 5, 7 of 40 goals stop earlier, saving 31 turns and $4.20; ...``."""
        parts = [
            f"{self.stop_earlier} of {self.goals} goal(s) stop earlier, saving {self.saved_turns} turn(s), "
            f"{self.saved_tokens} tokens and ${self.saved_cost:.2f}"
        ]
        if self.run_longer:
            parts.append(f"{self.run_longer} would run longer than the log can tell")
        if self.differ:
            parts.append(f"{self.differ} decide differently otherwise")
        parts.append(f"{self.unchanged} unchanged")
        return f"with {policy}, " + "; ".join(parts)


def totals(reports: list[GoalReplay]) -> Totals:
    """Add the per-goal results up."""
    t = Totals(goals=len(reports))
    for rep in reports:
        d = rep.divergence
        if d is None:
            t.unchanged += 1
            continue
        if d.outcome == "stops_earlier":
            t.stop_earlier += 1
        elif d.outcome == "runs_longer":
            t.run_longer += 1
        else:
            t.differ += 1
        t.saved_turns += rep.saved_turns
        t.saved_tokens += rep.saved_tokens
        t.saved_cost += rep.saved_cost
    return t


async def goal_streams(store: LogStore, goal_ids: list[str] | None = None) -> dict[str, list[Envelope]]:
    """Every goal stream of the log (or only those of ``goal_ids``), each in version order."""
    wanted = None if goal_ids is None else {GOAL_PREFIX + g for g in goal_ids}
    streams: dict[str, list[Envelope]] = {}
    if wanted is not None and len(wanted) == 1:
        (name,) = wanted
        streams[name] = [e async for e in store.read_stream(name)]
    else:
        async for batch in store.read_batches():
            for env in batch:
                if env.stream.startswith(GOAL_PREFIX) and (wanted is None or env.stream in wanted):
                    streams.setdefault(env.stream, []).append(env)
    return {name[len(GOAL_PREFIX) :]: envs for name, envs in streams.items() if envs}


async def whatif(store: LogStore, policy: Policy, goal_ids: list[str] | None = None) -> list[GoalReplay]:
    """Each goal (every goal when ``goal_ids`` is ``None``) re-decided under ``policy``, in stream-name order."""
    streams = await goal_streams(store, goal_ids)
    return [replay_goal_events(streams[g], policy) for g in sorted(streams)]
