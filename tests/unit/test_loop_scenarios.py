"""The acceptance scenarios of docs/reference/loop-plugin.md#s6 on a fake clock, a real SQLite log and the
simulated host.

Where docs/reference/loop-plugin.md#s7-3 asks an event-sourced engine to do better than the reference (nominal
grid instead of drift,
recorded missed slots, no double fire), the test says so and checks the better behaviour.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from loopd_es.clock import from_ms
from loopd_es.domain.loop import texts
from loopd_es.domain.loop.decide import task_id_for
from loopd_es.domain.loop.jitter import jitter_offset
from loopd_es.events import loop as ev
from loopd_es.sched.runner import WAIT_RETRY

from ._loop_harness import T0, ms, world

pytestmark = pytest.mark.anyio


async def test_scenario_1_fixed_creation_runs_now(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        out = await w.loop("5m check deploy", origin_id="m1")
        tid = task_id_for("m1")
        t = await w.task(tid)
        assert (t.mode, t.interval_ms, t.prompt, t.jitter, t.session_id) == (
            "fixed",
            300_000,
            "check deploy",
            True,
            "s1",
        )
        assert ms(t.last_fired_at) == T0
        assert T0 + 285_000 <= ms(t.next_due_at) <= T0 + 315_000
        assert out.message == (
            f'🔁 Loop started: every 5m (running now), prompt "check deploy" [id={tid}] [s=s1]. '
            f"Cancel: `/loop cancel {tid}`"
        )
        assert out.model_prompt is not None
        assert "first execution" in out.model_prompt and "every 5m" in out.model_prompt
        assert out.model_prompt.endswith("check deploy")


async def test_scenario_11_same_message_twice_makes_one_task(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        a = await w.loop("1m ping the server", origin_id="msg-7")
        b = await w.loop("1m ping the server", origin_id="msg-7")
        assert a.task_id == b.task_id and len((await w.session()).live()) == 1


async def test_scenario_13_nominal_grid_keeps_the_reference_offsets(tmp_path: Path) -> None:
    # The reference anchors each cycle at the (late) fire start; we keep the same jitter per slot on a
    # nominal grid, so lateness never accumulates (docs/reference/loop-plugin.md#s7-3).
    async with world(tmp_path) as w:
        await w.loop("5m --jitter=true check", origin_id="x")
        tid = task_id_for("x")
        t = await w.task(tid)
        assert ms(t.next_due_at) == T0 + 300_000 + jitter_offset(tid, 300_000, T0)
        w.now = ms(t.next_due_at) + 4_000  # the runner is 4 s late
        await w.activate("s1")
        r = await w.tick()
        assert r.fired == [(tid, 1)]
        t = await w.task(tid)
        base = T0 + 300_000
        assert ms(t.next_due_at) == base + 300_000 + jitter_offset(tid, 300_000, base)


async def test_scenario_13_jitter_off_is_exact(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        await w.loop("5m --jitter=false check", origin_id="x")
        await w.activate("s1")
        tid = task_id_for("x")
        for k in (1, 2, 3):
            w.now = T0 + k * 300_000 + 2_500
            assert (await w.tick()).fired == [(tid, k)]
            assert ms((await w.task(tid)).next_due_at) == T0 + (k + 1) * 300_000


async def test_scenario_14_last_fired_is_completion_and_anchor_is_nominal(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        await w.loop("60s --jitter=false say hi", origin_id="x")
        await w.activate("s1")
        tid = task_id_for("x")
        w.now = T0 + 60_000
        await w.tick()
        t = await w.task(tid)
        assert ms(t.next_due_at) == T0 + 120_000
        assert ms(t.last_fired_at) == T0 + 60_000
        prompts = await w.prompts("s1")
        assert prompts[-1] == texts.fire_text(tid, "say hi")


async def test_scenario_15_once(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        out = await w.loop("30s --once say hi", origin_id="x")
        tid = task_id_for("x")
        t = await w.task(tid)
        assert t.once and t.prompt == "say hi" and "(runs once)" in out.message
        assert ms(t.next_due_at) <= T0 and t.last_fired_at is None
        assert out.model_prompt is not None and "successfully created" in out.model_prompt
        assert "once" in (await w.loop("list")).message
        await w.activate("s1")
        assert (await w.tick()).fired == [(tid, 1)]
        assert (await w.task(tid)).cancelled == "once-complete"
        assert (await w.loop("list")).message == texts.NO_LIST


async def test_scenario_15_failed_once_is_retried_with_the_same_slot(tmp_path: Path) -> None:
    from loopd_es.host.sim_script import FailureRule

    async with world(tmp_path) as w:
        await w.loop("30s --once say hi", origin_id="x")
        tid = task_id_for("x")
        await w.activate("s1")
        await w.host.inject(FailureRule(op="prompt", on_call=1, error="unavailable"))
        r = await w.tick()
        assert r.failed and r.failed[0][:2] == (tid, 1)
        t = await w.task(tid)
        assert t.live and t.next_slot == 1 and t.next_attempt == 2 and ms(t.next_due_at) == T0 + 30_000
        w.now = T0 + 30_000
        assert (await w.tick()).fired == [(tid, 1)]
        claims = [e for e in await w.events() if isinstance(e, ev.SlotClaimed)]
        assert [(c.slot, c.attempt) for c in claims] == [(1, 1), (1, 2)]


async def test_scenario_16_adaptive_creation(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        out = await w.loop("check the deploy", origin_id="x")
        tid = task_id_for("x")
        t = await w.task(tid)
        assert (t.mode, t.adaptive_min_ms, t.adaptive_max_ms) == ("adaptive", 60_000, 3_600_000)
        assert 1_830_000 <= ms(t.next_due_at) - ms(t.created_at) < 1_830_100
        assert t.last_fired_at is not None
        assert out.model_prompt is not None
        for word in ("check the deploy", tid, "set_fixed", "delayMs"):
            assert word in out.model_prompt
        created = (await w.events())[0]
        assert isinstance(created, ev.TaskCreated) and created.fallback_u == 0.5


async def test_scenario_17_adaptive_fallback_written_before_the_fire(tmp_path: Path) -> None:
    from loopd_es.sched.tools import loop_schedule

    async with world(tmp_path, adaptive_min_ms=1_000, adaptive_max_ms=3_000) as w:
        await w.loop("watch it", origin_id="x")
        tid = task_id_for("x")
        await w.activate("s1")
        due = ms((await w.task(tid)).next_due_at)
        w.now = due
        await w.tick()
        t = await w.task(tid)
        assert ms(t.next_due_at) == due + 2_000 and ms(t.last_fired_at) == due
        assert str(due + 2_000) in (await w.prompts("s1"))[-1]
        r = await loop_schedule(w.store, {"action": "reschedule", "taskId": tid, "nextDueAtMs": due + 2_500},
                                session_id="s1", now=from_ms(due), cfg=w.cfg, origin_id="o")  # fmt: skip
        assert r["ok"] and ms((await w.task(tid)).next_due_at) == due + 2_500


async def test_scenario_18_reschedule_clamps(tmp_path: Path) -> None:
    from loopd_es.sched.tools import loop_schedule

    async with world(tmp_path, adaptive_min_ms=1_000, adaptive_max_ms=3_000) as w:
        await w.loop("watch it", origin_id="x")
        tid = task_id_for("x")
        now = w.now

        async def call(**a: object) -> dict[str, object]:
            return await loop_schedule(w.store, {"action": "reschedule", "taskId": tid, **a}, session_id="s1",
                                       now=from_ms(now), cfg=w.cfg, origin_id="o", u=0.5)  # fmt: skip

        for delay, eff in ((2_000, 2_000), (100, 1_000), (10_000, 3_000)):
            r = await call(delayMs=delay)
            assert (r["requestedDelayMs"], r["effectiveDelayMs"]) == (delay, eff)
        for at, due in ((now + 500, now + 1_000), (now + 2_000, now + 2_000), (now + 9_000, now + 3_000)):
            await call(nextDueAtMs=at)
            assert ms((await w.task(tid)).next_due_at) == due
        await call()
        assert ms((await w.task(tid)).next_due_at) == now + 2_000
        before = (await w.task(tid)).next_due_at
        r = await call(delayMs=1, nextDueAtMs=1)
        assert r == {"ok": False, "error": "delayMs and nextDueAtMs are mutually exclusive"}
        assert (await w.task(tid)).next_due_at == before
        resched = [e for e in await w.events() if isinstance(e, ev.TaskRescheduled)]
        assert (resched[1].requested_delay_ms, resched[1].min_ms, resched[1].max_ms, ms(resched[1].next_due_at)) == (
            100, 1_000, 3_000, now + 1_000,
        )  # fmt: skip


async def test_scenario_19_set_fixed(tmp_path: Path) -> None:
    from loopd_es.sched.tools import loop_schedule

    async with world(tmp_path) as w:
        await w.loop("watch it", origin_id="x")
        await w.loop("5m fixed one", origin_id="y")
        tid, fixed_id = task_id_for("x"), task_id_for("y")

        async def call(**a: object) -> dict[str, object]:
            return await loop_schedule(w.store, {"action": "set_fixed", **a}, session_id="s1", now=w.at,
                                       cfg=w.cfg, origin_id="o")  # fmt: skip

        for bad in (None, 999, float("nan")):
            assert not (await call(taskId=tid, intervalMs=bad))["ok"]
        assert (await w.task(tid)).mode == "adaptive"
        assert await call(taskId=fixed_id, intervalMs=120_000) == {
            "ok": False,
            "error": "set_fixed requires an Adaptive task",
        }
        assert (await w.task(fixed_id)).interval_ms == 300_000
        r = await call(taskId=tid, intervalMs=120_000)
        assert r["ok"]
        t = await w.task(tid)
        assert (t.mode, t.jitter, t.adaptive_min_ms) == ("fixed", False, None)
        assert ms(t.next_due_at) - ms(t.last_fired_at) == 120_000
        await w.loop("watch 2", origin_id="z")
        await call(taskId=task_id_for("z"), intervalMs=120_000, jitterEnabled=True)
        assert (await w.task(task_id_for("z"))).jitter is True


async def test_scenario_20_resume_does_not_catch_up(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        await w.loop("watch it", origin_id="a")
        await w.loop("", origin_id="m")
        await w.activate("s1")
        for tid in (task_id_for("a"), task_id_for("m")):
            assert (await w.loop(f"pause {tid}")).message == f"⏸ Paused {tid}"
        w.now += 4_000_000
        assert (await w.tick()).fired == []
        for tid in (task_id_for("a"), task_id_for("m")):
            assert (await w.loop(f"resume {tid}")).message == f"▶ Resumed {tid}"
        assert ms((await w.task(task_id_for("a"))).next_due_at) > w.now
        assert ms((await w.task(task_id_for("m"))).next_due_at) > w.now + 3_500_000
        assert (await w.tick()).fired == []


async def test_scenario_21_inactive_session_waits_then_fires_once_and_records_missed(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        await w.loop("1s --jitter=false a", origin_id="a")
        await w.loop("1s --jitter=false b", origin_id="b")
        await w.activate("s2")
        w.now += 61_000
        r = await w.tick()
        assert r.fired == [] and r.waiting == 2
        await w.activate("s1")
        fired = []
        for _ in range(3):
            fired += (await w.tick()).fired
        assert sorted(t for t, _ in fired) == sorted([task_id_for("a"), task_id_for("b")])
        for tid in (task_id_for("a"), task_id_for("b")):
            t = await w.task(tid)
            assert t.fires == 1 and t.missed == 60  # better than a silent collapse: the 60 are recorded
            assert ms(t.next_due_at) == T0 + 62_000  # still on the grid


async def test_scenario_22_loop_md_reread_on_every_fire(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        md = w.project / ".opencode" / "loop.md"
        md.parent.mkdir()
        md.write_text("maintenance v1")
        await w.loop("", origin_id="m")
        tid = task_id_for("m")
        t = await w.task(tid)
        assert t.mode == "maintenance" and t.loop_file_path == str(md) and t.content_hash
        await w.activate("s1")
        w.now += 3_600_000
        await w.tick()
        last = (await w.prompts("s1"))[-1]
        assert "unchanged" in last and "maintenance v1" not in last
        md.write_text("maintenance v2 changed")
        w.now += 3_600_000
        await w.tick()
        assert (await w.prompts("s1"))[-1].endswith("maintenance v2 changed")
        assert (await w.task(tid)).prompt == "maintenance v2 changed"
        md.unlink()
        n = len(await w.prompts())
        w.now += 3_600_000
        r = await w.tick()
        assert len(await w.prompts()) == n and r.failed == [(tid, 3, "loop.md missing or empty")]
        assert (await w.task(tid)).live  # stays armed


async def test_scenario_23_default_and_user_level_maintenance(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        out = await w.loop("", origin_id="m")
        t = await w.task(task_id_for("m"))
        assert t.prompt.startswith("Continue any unfinished work") and t.adaptive_max_ms == 3_600_000
        assert "Running now" in out.message and ms(t.last_fired_at) >= T0
        assert ms(t.next_due_at) >= T0 + 3_500_000
        (w.home / ".opencode").mkdir()
        (w.home / ".opencode" / "loop.md").write_text("user-level maintenance")
        await w.loop("", origin_id="m2")
        assert (await w.task(task_id_for("m2"))).prompt == "user-level maintenance"
        (w.project / "loop.md").write_text("project text")
        await w.loop("", origin_id="m3")
        assert (await w.task(task_id_for("m3"))).prompt == "project text"


async def test_scenario_24_tool_creation_due_times(tmp_path: Path) -> None:
    from loopd_es.sched.tools import loop_schedule

    async with world(tmp_path) as w:
        r = await loop_schedule(w.store, {"action": "create", "prompt": "p", "intervalMs": 1_800_000, "once": True},
                                session_id="s1", now=from_ms(T0), cfg=w.cfg, origin_id="t1")  # fmt: skip
        t = await w.task(r["task"]["id"])
        assert ms(t.next_due_at) == T0 + 1_800_000 and t.last_fired_at is None
        # The reference gives tool-made maintenance tasks a 60 s cadence (docs/reference/loop-plugin.md#s7-2
        # bug 9); here they get the period.
        r = await loop_schedule(w.store, {"action": "create", "prompt": "tidy up", "mode": "maintenance"},
                                session_id="s1", now=from_ms(T0), cfg=w.cfg, origin_id="t2")  # fmt: skip
        t = await w.task(r["task"]["id"])
        assert ms(t.next_due_at) == T0 + 3_600_000
        r = await loop_schedule(w.store, {"action": "create", "prompt": "p", "intervalMs": 300_000},
                                session_id="s1", now=from_ms(T0), cfg=w.cfg, origin_id="t3")  # fmt: skip
        tid = r["task"]["id"]
        await loop_schedule(w.store, {"action": "reschedule", "taskId": tid, "nextDueAtMs": 5}, session_id="s1",
                            now=from_ms(T0), cfg=w.cfg, origin_id="o")  # fmt: skip
        assert ms((await w.task(tid)).next_due_at) == 5


async def test_scenario_25_scoping(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        await w.loop("5m a1", origin_id="a1")
        await w.loop("5m a2", origin_id="a2")
        await w.loop("5m b1", session="s2", origin_id="b1")
        b1 = task_id_for("b1")
        listing = (await w.loop("list")).message
        assert listing.startswith("📋 2 loop task(s):") and b1 not in listing and "[s:" not in listing
        assert listing.endswith(texts.LIST_FOOTER)
        assert (await w.loop(f"cancel {b1}")).message == f"❌ No task {b1} in this session"
        assert (await w.loop(f"cancel {b1} --all")).message == f"❌ No task {b1} in this session"
        assert (await w.loop(f"pause {b1}")).error == "usage"
        assert not (await w.task(b1, "s2")).paused
        assert (await w.loop("stop --all")).message == "❌ No task --all in this session"
        assert (await w.loop("stop-all --all")).message == "🛑 Cancelled 2 task(s) in current session"
        assert (await w.task(b1, "s2")).live
        await w.loop(f"pause {b1}", session="s2")
        assert (await w.loop(f"resume {b1}", session="s2")).message == f"▶ Resumed {b1}"


async def test_scenario_26_tools_are_scoped(tmp_path: Path) -> None:
    from loopd_es.sched.tools import loop_schedule, loop_status

    async with world(tmp_path) as w:
        await w.loop("watch", session="s2", origin_id="b")
        tid = task_id_for("b")

        async def call(sid: str, **a: object) -> dict[str, object]:
            return await loop_schedule(
                w.store, dict(a), session_id=sid, now=from_ms(T0), cfg=w.cfg, origin_id="o"
            )

        assert (await call("s1", action="list"))["count"] == 0
        assert (await call("s1", action="list", all=True))["count"] == 0
        for action in ("cancel", "pause"):
            assert "in this session" in str((await call("s1", action=action, taskId=tid))["error"])
        assert "in this session" in str(
            (await call("s1", action="set_fixed", taskId=tid, intervalMs=60_000))["error"]
        )
        assert (await call("s2", action="set_fixed", taskId=tid, intervalMs=60_000))["ok"]
        st = await loop_status(w.store, session_id="s1")
        assert st["scope"] == "s1" and st["activeTasks"] == 0
        assert (await loop_status(w.store, session_id="s2"))["activeTasks"] == 1


async def test_scenario_27_session_deleted(tmp_path: Path) -> None:
    from loopd_es.sched import service

    async with world(tmp_path) as w:
        await w.loop("5m a", origin_id="a")
        await w.loop("5m b", session="s2", origin_id="b")
        assert await service.delete_session(w.store, "s1", w.at) == 1
        assert (await w.task(task_id_for("a"))).cancelled == "session-deleted"
        assert (await w.task(task_id_for("b"), "s2")).live


async def test_scenario_28_child_session_keeps_the_root_active(tmp_path: Path) -> None:
    from loopd_es.events.catalogue import new_event

    async with world(tmp_path) as w:
        await w.loop("1s --jitter=false a", origin_id="a")
        await w.store.append(
            ev.ACTIVE_STREAM, [new_event(ev.SessionLinked(session_id="child", parent_id="s1"))]
        )
        await w.activate("child")
        w.now += 1_000
        assert (await w.tick()).fired == [(task_id_for("a"), 1)]


async def test_scenario_29_max_tasks(tmp_path: Path) -> None:
    async with world(tmp_path, max_tasks=3) as w:
        for i in range(2):
            await w.loop(f"5m t{i}", origin_id=f"a{i}")
        await w.loop("5m t", session="s2", origin_id="b")
        out = await w.loop("5m another task", origin_id="z")
        assert out.message == "❌ /loop failed: Max tasks (3) reached. Cancel some before adding more."
        assert out.error == "conflict" and len((await w.session()).live()) == 2
        from loopd_es.errors import DomainError
        from loopd_es.sched.tools import loop_schedule

        with pytest.raises(DomainError, match=r"^Max tasks \(3\) reached. Cancel some before adding more.$"):
            await loop_schedule(w.store, {"action": "create", "prompt": "p", "intervalMs": 60_000}, session_id="s1",
                                now=from_ms(T0), cfg=w.cfg, origin_id="t")  # fmt: skip


async def test_busy_session_waits_and_one_injection_per_session_at_a_time(tmp_path: Path) -> None:
    from loopd_es.host.sim_script import HostScript, ScriptSession

    async with world(tmp_path) as w:
        # after each prompt the session is busy for two status polls (the model's turn), then idle
        w.host.script = HostScript(sessions=(ScriptSession(id="s1"),), prompt_busy_polls=2).resolved(
            "sim:memory"
        )
        await w.loop("5m --jitter=false a", origin_id="a")
        await w.loop("5m --jitter=false b", origin_id="b")
        await w.activate("s1")
        await w.host.set_status("s1", "busy")  # the user's own turn is running
        w.now += 300_000
        r = await w.tick()
        assert r.fired == [] and r.waiting == 2
        await w.host.set_status("s1", "idle")
        assert (
            await w.tick()
        ).waiting == 0  # nothing in the log changed: the host is polled again a second later
        assert w.sched.next_wake() == w.at + WAIT_RETRY  # (so a sleeping scheduler does not spin meanwhile)
        w.now += 1_000
        r = await w.tick()
        assert len(r.fired) == 1 and r.waiting == 1  # the second waits for the first turn to end
        r = await w.tick()
        assert r.fired == [] and r.waiting == 1
        w.now += 1_000
        r = await w.tick()
        assert len(r.fired) == 1
        fired = [e for e in await w.events() if isinstance(e, ev.FireSucceeded)]
        assert sorted(e.task_id for e in fired) == sorted([task_id_for("a"), task_id_for("b")])


async def test_any_loop_command_activates_its_session_once(tmp_path: Path) -> None:
    from loopd_es.sched import service

    async with world(tmp_path) as w:
        await w.loop("1s --jitter=false a", origin_id="a")
        await w.loop("list", session="s2")
        assert await service.active_session(w.store) == "s2"
        w.now += 1_000
        assert (await w.tick()).fired == []
        await w.loop("list")
        await w.loop("list")
        assert await w.store.stream_version(ev.ACTIVE_STREAM) == 3  # s1, s2, s1: a repeat writes nothing
        assert (await w.tick()).fired == [(task_id_for("a"), 1)]


async def test_loop_md_is_trimmed_as_javascript_trims_it(tmp_path: Path) -> None:
    """A BOM and Unicode spaces around loop.md are trimmed (hash included); U+0085 is text, as in the reference."""
    import hashlib

    async with world(tmp_path) as w:
        md = w.project / ".opencode" / "loop.md"
        md.parent.mkdir()
        md.write_text("\ufeff\u3000only a BOM and spaces\u00a0\n")
        out = await w.loop("", origin_id="m1")
        t = await w.task(task_id_for("m1"))
        assert t.prompt == out.model_prompt == "only a BOM and spaces"
        assert t.content_hash == hashlib.sha256(b"only a BOM and spaces").hexdigest()[:16]
        md.write_text("\ufeff \u2028")
        await w.loop("", origin_id="m2")
        assert (await w.task(task_id_for("m2"))).prompt == texts.DEFAULT_MAINTENANCE
        md.write_text("\x85keep\x85")
        await w.loop("", origin_id="m3")
        assert (await w.task(task_id_for("m3"))).prompt == "\x85keep\x85"


async def test_a_failing_or_help_command_activates_its_session_before_parsing(tmp_path: Path) -> None:
    """Issue #23: the reference activates the session first, so a ``/loop`` error in s1 lets s1's due tasks fire."""
    from loopd_es.sched import service

    async with world(tmp_path) as w:
        await w.loop("1s --jitter=false a", origin_id="a")
        await w.activate("s2")
        w.now += 1_000
        assert (await w.tick()).fired == []
        out = await w.loop("5m")
        assert out.error == "usage" and out.message.startswith("❌ Missing prompt")
        assert await service.active_session(w.store) == "s1"
        assert (await w.tick()).fired == [(task_id_for("a"), 1)]
        for args in ("help", "--bogus x", "cancel", "0 9 * * 1-5", "--once x"):
            await w.activate("s2")
            await w.loop(args)
            assert await service.active_session(w.store) == "s1", args
        await w.activate("s2")
        await w.loop("5m", session=None)  # no session: nothing to activate, s2 stays
        assert await service.active_session(w.store) == "s2"


async def test_the_model_gets_a_presentation_or_failure_prompt(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        out = await w.loop("5m")
        assert out.model_prompt is not None
        assert out.model_prompt.startswith(
            'The user\'s /loop command failed: Missing prompt after interval "5m".'
        )
        assert "Do not call tools" in out.model_prompt
        out = await w.loop("list")
        assert out.model_prompt is not None and out.model_prompt.startswith(
            "The opencode-plugin-loop plugin has fully handled the user's /loop command. The command result is:\n\n"
            "No loop tasks."
        )
        assert (
            "Do not call tools in this reply, and do not execute any task prompt in this reply —"
            in out.model_prompt
        )
