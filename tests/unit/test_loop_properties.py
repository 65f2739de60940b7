"""Properties of the slot grid (pure: decide + evolve, no I/O): whatever the tick times, every slot is claimed or
recorded missed exactly once, never early, and the schedule stays on its nominal grid (no drift)."""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from loopd_es.clock import from_ms, to_ms
from loopd_es.domain.loop import decide
from loopd_es.domain.loop.jitter import jitter_offset
from loopd_es.domain.loop.model import SessionLoops, evolve
from loopd_es.events import loop as ev

T0 = 1_800_000_000_000
CFG = decide.Config()


def nominal_due(tid: str, iv: int, jitter: bool, slot: int) -> int:
    base = T0 + (slot - 1) * iv
    return base + iv + (jitter_offset(tid, iv, base) if jitter else 0)


@given(
    tid=st.text("abcdefghijklmnopqrstuvwxyz0123456789", min_size=8, max_size=8),
    iv=st.sampled_from([1_000, 10_000, 60_000, 300_000, 3_600_000]),
    jitter=st.booleans(),
    gaps=st.lists(st.tuples(st.integers(0, 8_000_000), st.booleans()), max_size=30),
)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(tid="abc12345", iv=300_000, jitter=True, gaps=[(312_525, True), (300_000, True), (5_000_000, False)])
def test_every_slot_is_claimed_or_missed_once_on_the_grid(
    tid: str, iv: int, jitter: bool, gaps: list[tuple[int, bool]]
) -> None:
    s = SessionLoops(session_id="s1")
    due0 = nominal_due(tid, iv, jitter, 1)
    evolve(s, ev.TaskCreated(task_id=tid, origin_id="m", session_id="s1", prompt="p", mode="fixed", interval_ms=iv,
                             jitter=jitter, created_at=from_ms(T0), ran_on_creation=True,
                             next_due_at=from_ms(due0)))  # fmt: skip
    now = T0
    seen: list[int] = []
    for gap, ok in gaps:
        now += gap
        c = decide.claim(s, tid, from_ms(now), by="x", u=0.5)
        t = s.tasks[tid]
        if c is None:
            assert t.next_due_at is not None and to_ms(t.next_due_at) > now
            continue
        for e in c.events:
            evolve(s, e)
            if isinstance(e, ev.SlotsMissed):
                seen += range(e.first_slot, e.last_slot + 1)
            elif isinstance(e, ev.SlotClaimed):
                seen.append(e.slot)
                assert to_ms(e.due_at) == nominal_due(tid, iv, jitter, e.slot) <= now  # never early
                assert e.next_due_at is not None
                assert to_ms(e.next_due_at) == nominal_due(tid, iv, jitter, e.slot + 1) > now  # on the grid
        for e in decide.close(
            t, slot=c.slot, attempt=c.attempt, now=from_ms(now), error=None if ok else "boom"
        ):
            evolve(s, e)
    assert seen == list(range(1, len(seen) + 1))


@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["pause", "resume", "resched", "cancel", "tick"]), st.integers(0, 9),
                  st.integers(0, 100_000)),
        max_size=60,
    )
)  # fmt: skip
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_due_index_agrees_with_the_plain_definition(ops: list[tuple[str, int, int]]) -> None:
    from loopd_es.domain.loop.due import DueIndex

    sessions = {f"s{i % 3}": SessionLoops(session_id=f"s{i % 3}") for i in range(3)}
    index = DueIndex()
    for i in range(10):
        s = sessions[f"s{i % 3}"]
        evolve(s, ev.TaskCreated(task_id=f"t{i}", origin_id=f"m{i}", session_id=s.session_id, prompt="p",
                                 mode="adaptive", created_at=from_ms(T0), next_due_at=from_ms(T0 + i * 7_000)))  # fmt: skip
        index.push(from_ms(T0 + i * 7_000), s.session_id, f"t{i}")
    now = T0
    for op, i, x in ops:
        s = sessions[f"s{i % 3}"]
        tid = f"t{i}"
        if op == "tick":
            now += x
            got = index.pop_due(from_ms(now), lambda sid, k: sessions[sid].tasks[k].due_at())
            assert sorted(got) == decide.due_now(sessions.values(), from_ms(now))
            for due, sid, k in got:  # not fired: still due next time
                index.push(due, sid, k)
            continue
        e: ev.TaskPaused | ev.TaskResumed | ev.TaskRescheduled | ev.TaskCancelled
        if op == "pause":
            e = ev.TaskPaused(task_id=tid, at=from_ms(now))
        elif op == "resume":
            e = ev.TaskResumed(task_id=tid, at=from_ms(now), next_due_at=from_ms(now + x))
        elif op == "resched":
            e = ev.TaskRescheduled(task_id=tid, at=from_ms(now), next_due_at=from_ms(now + x - 50_000))
        else:
            e = ev.TaskCancelled(task_id=tid, reason="user", at=from_ms(now))
        evolve(s, e)
        index.push(s.tasks[tid].due_at(), s.session_id, tid)
