"""Crash recovery: find every switch saga a dead process left open and settle it from the host's live identity.

Run at the start of every command that runs sagas. It reads the log from the last checkpoint
(``saga-checkpoints``): a switch is open from its ``identity.switch_requested`` until its
``saga.switch_finished``. Each open switch is settled by :meth:`SwitchSaga.drive` with ``recovering=True``:

- no saga stream yet (the process died right after the request): start it; no host call was made, so it is
  recorded as failed with nothing to undo;
- an open intent: resolved by reading the live session identity (landed or not);
- every half live: recorded as applied; otherwise the halves that landed are compensated (agent, then model)
  and the switch is recorded as failed (``identity.switch_rolled_back``, or ``identity.rollback_failed``).

A saga whose owner process is still alive (another CLI running right now) is left alone. A checkpoint is
written once the scan has moved :data:`CHECKPOINT_EVERY` events past the last one.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Final

from ..errors import WrongExpectedVersionError
from ..events import saga as s
from ..events.catalogue import decode_payload
from ..host.errors import HostError
from .identity_switch import RUNNING, SwitchReport, SwitchSaga
from .ports import Ctx

if TYPE_CHECKING:
    from .ports import GoalPort

CHECKPOINT_STREAM: Final = "saga-checkpoints"
CHECKPOINT_EVERY: Final = 256


def _alive(pid: int) -> bool:
    if pid <= 0 or pid == os.getpid():  # our own pid at startup can only be a recycled, dead owner's
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def open_switches(service: GoalPort) -> tuple[dict[str, str], int, int, int, dict[str, Ctx]]:
    """Open switches ``{switch_id: goal_id}``, the checkpoint's position and stream version, the last position
    scanned, and the causal context of each request seen (so recovery's events join the flow they finish).
    """
    flows: dict[str, Ctx] = {}
    store = service.store
    position = 0
    open_: dict[str, str] = {}
    cp_version = await store.stream_version(CHECKPOINT_STREAM)
    if cp_version:
        async for envelope in store.read_stream(CHECKPOINT_STREAM, from_version=cp_version):
            checkpoint = decode_payload(envelope)
            assert isinstance(checkpoint, s.SagaCheckpoint)
            position = checkpoint.position
            open_ = {o.switch_id: o.goal_id for o in checkpoint.open}
    scanned = position
    async for batch in store.read_batches(from_position=position + 1):
        for envelope in batch:
            scanned = envelope.position
            if envelope.type == "identity.switch_requested":
                data = envelope.data_dict()
                open_[data["switch_id"]] = data["goal_id"]
                flow = envelope.correlation_id or envelope.event_id
                flows[data["switch_id"]] = Ctx(flow, envelope.event_id)
            elif envelope.type == s.SwitchSagaFinished.event_type:
                open_.pop(envelope.data_dict()["switch_id"], None)
    return open_, position, cp_version, scanned, flows


async def recover(service: GoalPort, ctx: Ctx, *, only: str | None = None) -> list[SwitchReport]:
    """Settle every open switch saga whose owner is gone (of goal ``only``, when given); returns what each one
    became.

    Recovery's events carry the correlation id of the request they finish (``ctx`` only when that request lies
    before the checkpoint). A saga whose host cannot be read right now stays open (the next recovery retries).
    """
    saga_runner = SwitchSaga(service)
    open_, position, cp_version, scanned, flows = await open_switches(service)
    reports: list[SwitchReport] = []
    still_open: list[s.OpenSwitch] = []
    for switch_id, goal_id in open_.items():
        if switch_id in RUNNING or (only is not None and goal_id != only):
            still_open.append(s.OpenSwitch(goal_id=goal_id, switch_id=switch_id))
            continue
        saga = await saga_runner.load(switch_id)
        if saga.started is not None and saga.finished is None and _alive(saga.started.owner_pid):
            still_open.append(s.OpenSwitch(goal_id=goal_id, switch_id=switch_id))
            continue
        try:
            flow = flows.get(switch_id) or (Ctx(*saga.flow) if saga.flow else ctx)
            if saga.started is None:
                saga = await saga_runner.begin_recovered(goal_id, switch_id, flow)
            reports.append(await saga_runner.drive(saga, flow, recovering=True))
        except (HostError, WrongExpectedVersionError):
            still_open.append(s.OpenSwitch(goal_id=goal_id, switch_id=switch_id))
    if scanned - position >= CHECKPOINT_EVERY:
        checkpoint = s.SagaCheckpoint(position=scanned, open=tuple(still_open))
        try:
            await service.append(CHECKPOINT_STREAM, [checkpoint], ctx, for_goal=None, expected=cp_version)
        except WrongExpectedVersionError:
            pass  # another process checkpointed meanwhile; ours would say the same or less
    return reports
