"""Property (issue 9 items 3, 4, 8): whatever bytes of the last write survive a crash, the NDJSON log shows
whole writes only, and the next writer continues right after them.

Each example appends a few batches (raw payloads with line breaks and JSON whitespace among them), then keeps
the file up to a random byte of the last write, as a power cut that kept part of it would, leaving the sidecar
files as they were (ahead of the log) but for the boot the lock file's durable end was recorded in. The log must then read as exactly the earlier writes (or all of them
when the cut falls at the end), ``verify`` must say whether an unfinished write is left, and an append must
land at the next position.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path

import anyio
import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopd_es.events.envelope import NewEvent
from loopd_es.log.ndjson import NdjsonLog

from .test_ndjson_log import after_a_reboot

with warnings.catch_warnings():  # see tests/unit/test_log_properties.py
    warnings.simplefilter("ignore", DeprecationWarning)
    try:
        import hypothesis.extra._patching  # noqa: F401
    except ImportError:  # pragma: no cover
        pass

payloads = st.sampled_from(
    [
        {"a": 1},
        b'{"a":\n1}',
        b'\r\n{"b": [1,\r\n2]}\n',
        msgspec.Raw(b' {"c" : "x\\ny"} '),
        {"s": "line\nbreak"},
    ]
)
batches = st.lists(st.lists(payloads, min_size=1, max_size=4), min_size=1, max_size=4)


async def _write(path: Path, plan: list[list[object]]) -> list[int]:
    """Append each batch of ``plan``; returns the log's size after each write."""
    sizes = []
    async with await NdjsonLog.open(path) as store:
        for i, batch in enumerate(plan):
            await store.append(f"s{i % 2}", [NewEvent(type="t.x", data=data) for data in batch])
            sizes.append(os.stat(path).st_size)
    return sizes


async def _after_cut(path: Path) -> tuple[int, int, bool, int]:
    async with await NdjsonLog.open(path) as store:
        shown = [e async for e in store.read_all()]
        report = await store.verify()
        more = await store.append("after", [NewEvent(type="t.x", data={"z": 1})])
        return len(shown), report.events, report.ok, more[0].position


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=batches, where=st.floats(0, 1))
def test_a_cut_anywhere_in_the_last_write_leaves_whole_writes(plan: list[list[object]], where: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "log.ndjson"
        sizes = anyio.run(_write, path, plan)
        start = sizes[-2] if len(sizes) > 1 else 0
        cut = start + int((sizes[-1] - start) * where)
        with path.open("r+b") as f:
            f.truncate(cut)
        after_a_reboot(path)
        whole = sum(len(batch) for batch in (plan if cut == sizes[-1] else plan[:-1]))
        shown, verified, ok, next_position = anyio.run(_after_cut, path)
        assert shown == whole and verified == whole
        assert ok == (cut in (start, sizes[-1]))
        assert next_position == whole + 1
