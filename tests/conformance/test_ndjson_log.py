"""The log contract on the NDJSON backend, plus what only a file of JSON lines has to get right."""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from loopd_es.errors import LogNotFoundError, StoreUnavailableError, UsageError
from loopd_es.log import open_store
from loopd_es.log.ndjson import NdjsonLog

from .contract import LogStoreContract, assert_log_invariants, everything, new, stream_events
from .contract_integrity import IntegrityContract

if TYPE_CHECKING:
    from loopd_es.log.base import LogStore

pytestmark = pytest.mark.anyio

ENVELOPE_KEYS = [
    "position",
    "stream",
    "version",
    "event_id",
    "type",
    "schema_version",
    "recorded_at",
    "causation_id",
    "correlation_id",
    "data",
]


def _sidecars(log: Path) -> list[Path]:
    """Every file of the log but the log itself and the writers' lock file (which records writes in flight)."""
    return [p for p in log.parent.iterdir() if p.is_file() and p != log and not p.name.endswith(".lock")]


class TestNdjsonLog(LogStoreContract, IntegrityContract):
    durability = "always"

    @pytest.fixture
    def store_url(self, tmp_path: Path) -> str:
        return f"ndjson:{tmp_path / 'log.ndjson'}?durability={self.durability}"

    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[LogStore]:
        async with await NdjsonLog.open(tmp_path / "log.ndjson", durability=self.durability) as s:
            yield s

    # -- NDJSON only -------------------------------------------------------------------------------

    async def test_open_store_url_gives_this_backend(self, store_url: str) -> None:
        async with await open_store(store_url) as s:
            assert isinstance(s, NdjsonLog)
            assert s.url.startswith("ndjson:")
            assert "log.ndjson" in s.url

    async def test_file_is_one_envelope_per_line_with_keys_in_order(
        self, store: LogStore, tmp_path: Path
    ) -> None:
        await store.append("a", [new(i=1), new(i=2)])
        await store.append("b", [new(text="line\nbreak")])
        recorded = await everything(store)
        raw = (tmp_path / "log.ndjson").read_bytes()
        assert raw.endswith(b"\n")
        lines = raw.decode().splitlines()
        assert len(lines) == 3
        for line, env in zip(lines, recorded, strict=True):
            obj = json.loads(line)
            assert list(obj) == ENVELOPE_KEYS
            assert obj["position"] == env.position and obj["event_id"] == env.event_id
            assert obj["data"] == env.data_dict()

    @pytest.mark.parametrize("tamper", ["delete", "garbage", "stale", "truncate"])
    async def test_stream_index_is_validated_not_trusted(self, tmp_path: Path, tamper: str) -> None:
        log = tmp_path / "log.ndjson"
        async with await NdjsonLog.open(log, durability=self.durability) as s:
            for i in range(20):
                await s.append(f"s{i % 3}", [new(i=i)])
        saved = {p: p.read_bytes() for p in _sidecars(log)}
        async with await NdjsonLog.open(log, durability=self.durability) as s:
            for i in range(20, 30):
                await s.append(f"s{i % 3}", [new(i=i)])
            truth = await everything(s)
        for p in _sidecars(log):
            if tamper == "delete":
                p.unlink()
            elif tamper == "garbage":
                p.write_bytes(b"\x00garbage\xff" * 50)
            elif tamper == "truncate":
                p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
            elif p in saved:
                p.write_bytes(saved[p])  # an index from before the last ten appends
        async with await NdjsonLog.open(log, durability=self.durability) as s:
            for name in ("s0", "s1", "s2"):
                assert await stream_events(s, name) == [e for e in truth if e.stream == name]
                assert await s.stream_version(name) == len([e for e in truth if e.stream == name])
            assert await s.streams() == ["s0", "s1", "s2"]
            more = await s.append("s1", [new(i=99)], 10)
            assert (more[0].position, more[0].version) == (31, 11)
            assert_log_invariants(await everything(s))

    async def test_index_of_another_log_is_not_trusted(self, tmp_path: Path) -> None:
        one, two = tmp_path / "one", tmp_path / "two"
        one.mkdir()
        two.mkdir()
        async with await NdjsonLog.open(one / "log.ndjson", durability=self.durability) as s:
            await s.append("x", [new(i=i) for i in range(5)])
            await s.append("y", [new(i=i) for i in range(5)])
        async with await NdjsonLog.open(two / "log.ndjson", durability=self.durability) as s:
            await s.append("y", [new(i=i) for i in range(5)])
            await s.append("x", [new(i=i) for i in range(5)])
            truth = await everything(s)
        for p in _sidecars(one / "log.ndjson"):
            shutil.copy(p, two / p.name)
        async with await NdjsonLog.open(two / "log.ndjson", durability=self.durability) as s:
            assert await stream_events(s, "x") == truth[5:]
            assert await stream_events(s, "y") == truth[:5]

    async def test_missing_file_without_create_is_not_found(self, tmp_path: Path) -> None:
        with pytest.raises(LogNotFoundError):
            await NdjsonLog.open(tmp_path / "absent.ndjson", create=False)
        assert not (tmp_path / "absent.ndjson").exists()

    async def test_unwritable_path_is_unavailable(self, tmp_path: Path) -> None:
        (tmp_path / "a-file").write_text("not a directory")
        with pytest.raises(StoreUnavailableError):
            store = await open_store(f"ndjson:{tmp_path / 'a-file' / 'log.ndjson'}")
            async with store:
                await store.append("s", [new()])

    async def test_unknown_durability_is_a_usage_error(self, tmp_path: Path) -> None:
        with pytest.raises(UsageError):
            await open_store(f"ndjson:{tmp_path / 'log.ndjson'}?durability=sometimes")
        with pytest.raises(UsageError):
            await open_store(f"ndjson:{tmp_path / 'log.ndjson'}?colour=blue")


class TestNdjsonLogNoFsync(TestNdjsonLog):
    durability = "none"


class TestNdjsonLogBatchDurability(TestNdjsonLog):
    durability = "batch"
