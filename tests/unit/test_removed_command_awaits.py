"""Awaits left on a removed command are discarded with a ledger line (issue #22, item 8).

The reference's reconcile skipped removed commands, so such an await was never settled, and an import of such
a project dropped it without a trace. Here reconcile discards it (the goal is told why), and the importer
records the discard and reports it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from loopd_es.clock import parse_rfc3339
from loopd_es.domain import command as dc
from loopd_es.events import command as c
from loopd_es.events.catalogue import decode_data, new_event
from loopd_es.importer import build_plan
from loopd_es.log import open_store
from loopd_es.procs import service
from loopd_es.procs.paths import CommandPaths

pytestmark = pytest.mark.anyio

PROJECTS = Path(__file__).resolve().parents[1] / "fixtures" / "loopd_projects"
ACTIVE, PAUSED = "31111111-aaaa-4bbb-8ccc-000000000003", "41111111-aaaa-4bbb-8ccc-000000000004"
REMOVED = "c4222222-aaaa-4bbb-8ccc-000000000004"


async def test_reconcile_discards_an_await_left_on_a_removed_command(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'log.db'}"
    stream = "command-c1"
    async with await open_store(url) as store:
        await store.append(
            stream,
            [
                new_event(
                    c.CommandStarted(
                        command_id="c1",
                        title="t",
                        command="true",
                        cwd="/",
                        started_at=parse_rfc3339("2026-12-02T12:00:00.000Z"),
                    )
                ),
                new_event(c.AwaitRequested(goal_id="g1", command_id="c1")),
                new_event(
                    c.CommandExited(
                        command_id="c1",
                        status="exited",
                        end_reason="exit",
                        ended_at=parse_rfc3339("2026-12-02T12:00:01.000Z"),
                    )
                ),
                new_event(
                    c.CommandRemoved(command_id="c1")
                ),  # removed without cancelling: an old or imported log
            ],
        )
        state = await service.load_state(store, "c1")
        assert state is not None and state.removed and [a.goal_id for a in state.awaits] == ["g1"]
        await service.reconcile(store, CommandPaths(url))
        await service.reconcile(store, CommandPaths(url))  # once only
        discards = [
            e.data_dict() async for e in store.read_stream(stream) if e.type == "command.await-discarded"
        ]
        assert discards == [{"goal_id": "g1", "command_id": "c1", "reason": "command removed"}]


def test_import_records_and_reports_awaits_on_a_command_loopd_removed(tmp_path: Path) -> None:
    project = tmp_path / "p"
    shutil.copytree(PROJECTS / "v9_project", project)
    loopd = project / ".opencode" / "loopd"
    state = json.loads((loopd / "state.json").read_text())
    state["commandAwaits"].append(
        {
            "goalID": ACTIVE,
            "commandID": REMOVED,
            "ownerSessionID": "ses_owner1",
            "createdAt": "2026-11-20T10:26:00.000Z",
        }
    )
    (loopd / "state.json").write_text(json.dumps(state))
    ledger = (loopd / "events.ndjson").read_text().splitlines()
    # the pause's cancellation is lost too: the paused goal's await is still outstanding when loopd removed it
    kept = [line for line in ledger if '"type":"command.await-cancelled"' not in line or PAUSED not in line]
    (loopd / "events.ndjson").write_text("\n".join(kept) + "\n")
    plan = build_plan(project)
    batch = next(b for b in plan.batches if b.stream == f"command-{REMOVED}")
    events = [decode_data(e.type, e.data_bytes()) for e in batch.events]
    discarded = [(e.goal_id, e.reason) for e in events if isinstance(e, c.AwaitDiscarded)]
    assert sorted(discarded) == sorted([(PAUSED, "command removed"), (ACTIVE, "command removed")])
    assert isinstance(events[-1], c.CommandRemoved)
    folded = dc.fold(events)
    assert folded is not None and folded.removed and folded.awaits == ()
    assert any(f"await of goal {ACTIVE} on removed command {REMOVED}" in w for w in plan.warnings)
    assert any(f"await of goal {PAUSED} on removed command {REMOVED}" in w for w in plan.warnings)
