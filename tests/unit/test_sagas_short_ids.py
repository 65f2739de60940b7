"""Three switches in one minute read as three switches (#10.7): ids are shortened by what tells them apart."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopd_es.app.service import Ctx
from loopd_es.domain.streams import short_id, short_ids
from loopd_es.events.envelope import new_event_id
from loopd_es.postmortem import build_history, find_goal
from loopd_es.postmortem.history import render_text
from loopd_es.postmortem.timeline_html import timeline_model

from ._saga_harness import world

pytestmark = pytest.mark.anyio


def test_a_time_ordered_id_is_shown_by_its_random_tail() -> None:
    ids = [new_event_id() for _ in range(3)]
    assert len({i[:8] for i in ids}) == 1  # the head is a timestamp: the bug
    assert len({short_id(i) for i in ids}) == 3 and all(short_id(i) == "…" + i[-8:] for i in ids)
    assert short_id("5b0f3c52-8a51-4d3e-9a40-6c1f2f0e1a77") == "5b0f3c52"  # not time-ordered: its head
    assert len(set(short_ids(ids).values())) == 3


async def test_history_explain_and_timeline_tell_three_switches_apart(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        gid = await w.create()
        for model in ("p/new", "p/last", "p/old"):
            assert (await w.goals.switch_identity(gid, Ctx.new(), model=model)).outcome == "applied"
        goal = await find_goal(w.store, gid)
        switches = [s for s in goal.streams if s.startswith("switch-")]
        assert len(switches) == 3
        history = await build_history(w.store, goal)
        text = "\n".join(render_text(history))
        labels = {short_id(s.removeprefix("switch-")) for s in switches}
        assert len(labels) == 3 and all(f"switch-{label}" in text for label in labels)
        shorts = {e["short"] for e in timeline_model(history)["events"] if e["stream"].startswith("switch-")}
        assert len(shorts) == 3
