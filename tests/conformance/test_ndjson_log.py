"""The log contract on the NDJSON backend, plus what only a file of JSON lines has to get right."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest

from loopd_es.errors import CorruptLogError, LogNotFoundError, StoreUnavailableError, UsageError
from loopd_es.log import open_store
from loopd_es.log.ndjson import NdjsonLog
from loopd_es.log.ndjson_index import IndexFile
from loopd_es.testing import (
    IntegrityContract,
    LogStoreContract,
    assert_log_invariants,
    everything,
    new,
    stream_events,
)
from tests.waits import scaled_timeout

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


def after_a_reboot(log: Path) -> None:
    """A power cut is followed by a boot: the durable end the lock file records (its first 24 bytes: the end,
    then the boot id) is then the boot before's, which the store does not trust to say what was acknowledged."""
    lock = log.with_name(log.name + ".lock")
    with lock.open("r+b") as f:
        f.seek(8)
        f.write(b"another boot id!")


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

    @pytest.mark.parametrize("reseal", [False, True], ids=["edited", "edited-and-resealed"])
    async def test_an_append_never_writes_through_a_damaged_index(self, tmp_path: Path, reseal: bool) -> None:
        """A stream head's version edited in the index (resealed, its chain check passes) must not become the
        version of the next event: the append confirms the head from the log's own line and rebuilds."""
        from loopd_es.log.ndjson_index import PREFIX, RECORD_SIZE, first_chain, seal

        path = tmp_path / "events.ndjson"
        async with await open_store(f"ndjson:{path}") as s:
            for stream in ("a", "b", "b", "b"):
                await s.append(stream, [new()])
        index = path.with_name(path.name + ".idx")
        raw = bytearray(index.read_bytes())
        prefixes = [bytes(raw[i : i + PREFIX.size]) for i in range(0, len(raw), RECORD_SIZE)]
        fields = list(PREFIX.unpack(prefixes[0]))
        fields[3] = 5  # stream a's only event claims version 5
        prefixes[0] = PREFIX.pack(*fields)
        if reseal:
            index.write_bytes(seal(prefixes, first_chain())[0])
        else:
            raw[: PREFIX.size] = prefixes[0]
            index.write_bytes(bytes(raw))
        path.with_name(path.name + ".heads").unlink(missing_ok=True)
        async with await open_store(f"ndjson:{path}") as s:
            (env,) = await s.append("a", [new()])
            assert env.version == 2
            assert [(e.stream, e.version) for e in await everything(s)][-1] == ("a", 2)
            assert (await s.verify()).ok

    async def test_a_store_opened_to_read_never_rewrites_a_bad_index(self, tmp_path: Path) -> None:
        log = tmp_path / "log.ndjson"
        async with await NdjsonLog.open(log, durability=self.durability) as s:
            for i in range(10):
                await s.append(f"s{i % 2}", [new(i=i)])
            truth = await everything(s)
        for p in _sidecars(log):
            p.write_bytes(b"\x00garbage\xff" * 50)
        before = {p: p.read_bytes() for p in log.parent.iterdir()}
        async with await NdjsonLog.open(log, durability=self.durability, create=False) as s:
            assert await everything(s) == truth
            assert await stream_events(s, "s1") == [e for e in truth if e.stream == "s1"]
            assert (await s.verify()).events == 10
        assert {p: p.read_bytes() for p in log.parent.iterdir()} == before

    async def test_a_store_opened_to_read_creates_no_file(self, tmp_path: Path) -> None:
        log = tmp_path / "log.ndjson"
        async with await NdjsonLog.open(log, durability=self.durability) as s:
            truth = await s.append("s", [new(i=0), new(i=1)])
        for name in os.listdir(tmp_path):
            if name != log.name:
                os.unlink(tmp_path / name)  # a log copied without its sidecars
        async with await NdjsonLog.open(log, durability=self.durability, create=False) as s:
            assert await everything(s) == truth
            assert await stream_events(s, "s") == truth
            assert (await s.verify()).ok
        assert os.listdir(tmp_path) == ["log.ndjson"]
        async with await NdjsonLog.open(log, durability=self.durability, create=False) as s:
            more = await s.append("s", [new(i=2)], 2)  # a write: it creates the sidecars it needs
            assert more[0].position == 3
            assert (await s.verify(repair=True)).ok
        assert "log.ndjson.lock" in os.listdir(tmp_path)

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

    # -- issue 9: what only a file of lines can get wrong ---------------------------------------------

    @pytest.mark.parametrize("where", ["inside", "last-brace"])
    @pytest.mark.parametrize("sidecars", ["kept", "deleted"])
    async def test_a_damaged_last_line_is_corruption_and_never_cut(
        self, tmp_path: Path, where: str, sidecars: str
    ) -> None:
        log = tmp_path / "log.ndjson"
        async with await NdjsonLog.open(log, durability=self.durability) as s:
            for i in range(3):
                await s.append("s", [new(i=i)])
        data = bytearray(log.read_bytes())
        at = data.rindex(b'"position":3') + len(b'"position"') if where == "inside" else len(data) - 2
        data[at] ^= 0x01
        log.write_bytes(bytes(data))
        if sidecars == "deleted":
            for p in _sidecars(log):
                p.unlink()
        async with await NdjsonLog.open(log, durability=self.durability) as s:
            with pytest.raises(CorruptLogError) as info:
                await everything(s)
            assert info.value.exit_code == 4
            assert info.value.line in (3, None)
            with pytest.raises(CorruptLogError):
                await s.append("s", [new(i=9)])
            for repair in (False, True):
                if repair:
                    with pytest.raises(CorruptLogError):
                        await s.verify(repair=True)
                else:
                    report = await s.verify()
                    assert not report.ok
                    assert any("line 3" in p for p in report.problems), report.problems
        assert log.read_bytes() == bytes(data)

    async def test_damage_past_the_first_read_chunk_is_named_as_verify_names_it(self, tmp_path: Path) -> None:
        """Without its index a read scans the log a 1 MiB chunk at a time; the first scan stopped at the damage
        had moved the head but not the end it read to, so the next read named the line starting the second
        chunk ("expected position 3661, found 1") instead of the damaged one."""
        log = tmp_path / "log.ndjson"
        async with await NdjsonLog.open(log, durability=self.durability) as s:
            for batch in range(3):
                await s.append(f"s{batch}", [new(i=i, pad="x" * 500) for i in range(1000)])
        assert log.stat().st_size > 1 << 20  # the damage is past the first chunk
        lines = log.read_bytes().splitlines(keepends=True)
        lines[2499] = lines[2499].replace(b'"version":', b'"version"X', 1)
        log.write_bytes(b"".join(lines))
        for path in _sidecars(log) + [log.with_name(log.name + ".lock")]:
            path.unlink()
        async with await open_store(f"ndjson:{log}", create=False) as s:
            for read in range(2):  # the open, then each read: the same line, the same problem
                with pytest.raises(CorruptLogError) as info:
                    await s.head() if read == 0 else [b async for b in s.read_backwards(limit=1)]
                assert info.value.line == 2500 and "does not decode" in str(info.value), info.value
            report = await s.verify()
        assert any("line 2500" in p and "does not decode" in p for p in report.problems), report.problems

    @pytest.mark.parametrize("then", ["append", "repair"])
    async def test_a_writer_killed_between_write_and_sync_is_reported_until_synced(
        self, tmp_path: Path, then: str
    ) -> None:
        """Its batch is whole but was never acknowledged: read hides it, verify says so (not "clean"), and the
        next writer's sync (or a repair) makes it durable and visible, never half of it."""
        log = tmp_path / "log.ndjson"
        async with await NdjsonLog.open(log, durability=self.durability) as s:
            first = await s.append("s", [new(i=0)])
        with anyio.fail_after(scaled_timeout(60)):
            child = await anyio.run_process([sys.executable, "-c", _DIE_BEFORE_SYNC, str(log)], check=False)
        assert child.returncode == -9
        async with await NdjsonLog.open(log, durability=self.durability) as s:
            assert await everything(s) == first
            assert await s.head() == 1 and await s.stream_version("s") == 1
            report = await s.verify()
            assert not report.ok and report.events == 1, (report.events, report.problems)
            assert any("not yet synced" in p for p in report.problems), report.problems
            if then == "repair":
                report = await s.verify(repair=True)
                assert report.ok and report.events == 3, report.problems
                assert any("synced" in r for r in report.repaired), report.repaired
            more = await s.append("s", [new(i=3)])
            assert (more[0].position, more[0].version) == (4, 4)
            report = await s.verify()
            assert report.ok and report.events == 4, report.problems
            recorded = await everything(s)
            assert recorded[0] == first[0] and recorded[3] == more[0]
            assert [e.data_dict() for e in recorded[1:3]] == [{"i": 1}, {"i": 2}]
            assert_log_invariants(recorded)

    async def test_another_process_never_reads_an_event_before_its_sync_returns(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The writer syncs outside the lock; a reader process that looks while the sync runs sees none of the
        batch, and sees all of it once the append returned."""
        log = tmp_path / "log.ndjson"
        seen: list[int] = []
        real = os.fdatasync

        def reader() -> int:
            out = subprocess.run(
                [sys.executable, "-m", "loopd_es", "--store", f"ndjson:{log}", "read", "--json"],
                check=True, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            return len(out.stdout.splitlines())

        def sync_while_a_reader_looks(fd: int) -> None:
            seen.append(reader())
            real(fd)

        async with await NdjsonLog.open(log, durability="always") as s:
            await s.append("s", [new(i=0)])
            with monkeypatch.context() as m:
                m.setattr(os, "fdatasync", sync_while_a_reader_looks)
                await s.append("s", [new(i=1), new(i=2)])
            assert seen == [1]
            assert reader() == 3

    async def test_a_batch_cut_short_by_power_loss_is_never_visible(self, tmp_path: Path) -> None:
        log = tmp_path / "log.ndjson"
        async with await NdjsonLog.open(log, durability=self.durability) as s:
            first = await s.append("s", [new(i=0)])
            before = {p: p.read_bytes() for p in _sidecars(log)}
            await s.append("s", [new(i=1), new(i=2), new(i=3)])
        lines = log.read_bytes().splitlines(keepends=True)
        log.write_bytes(b"".join(lines[:3]))  # the pages of the batch's last line never reached the disk
        for p, content in before.items():  # nor did the index records written after the sync
            p.write_bytes(content)
        after_a_reboot(log)
        async with await NdjsonLog.open(log, durability=self.durability) as s:
            assert await everything(s) == first
            assert await s.stream_version("s") == 1
            report = await s.verify()
            assert not report.ok and report.events == 1, report.problems
            assert any("unfinished write" in p for p in report.problems), report.problems
            more = await s.append("s", [new(i=4)], 1)
            assert more[0].position == 2
            assert_log_invariants(await everything(s))
        assert len(log.read_bytes().splitlines()) == 2

    @pytest.mark.parametrize("cut", [20, "line"])
    async def test_a_log_cut_below_what_was_acknowledged_refuses_until_repaired(
        self, tmp_path: Path, cut: int | str
    ) -> None:
        """Acknowledged events cut from the file (by a copy, a ``truncate``, a disk tool) are lost events, not an
        unfinished write: reads and appends refuse, and nothing is cut or reused, until ``verify --repair``
        accepts the log as it is. (A failed append used to cut the rest as "never acknowledged" and give its
        position to the next event.)"""
        log = tmp_path / "log.ndjson"
        async with await NdjsonLog.open(log, durability=self.durability) as s:
            for i in range(3):
                await s.append("s", [new(i=i)])
        whole = log.read_bytes()
        last_line = len(whole.splitlines(keepends=True)[-1])
        os.truncate(log, len(whole) - (last_line if cut == "line" else int(cut)))
        damaged = log.read_bytes()
        async with await NdjsonLog.open(log, durability=self.durability) as s:
            with pytest.raises(CorruptLogError, match="acknowledged it up to byte"):
                await everything(s)
            with pytest.raises(CorruptLogError, match="acknowledged it up to byte"):
                await s.append("s", [new(i=9)], 3)
            report = await s.verify()
            assert not report.ok and any("acknowledged events were cut" in p for p in report.problems)
            assert not any("never acknowledged" in p for p in report.problems), report.problems
        assert log.read_bytes() == damaged
        async with await NdjsonLog.open(log, durability=self.durability) as s:
            report = await s.verify(repair=True)
            assert report.ok and report.events == 2, report.problems
            more = await s.append("s", [new(i=3)], 2)
            assert (more[0].position, more[0].version) == (3, 3)
        async with await NdjsonLog.open(log, durability=self.durability) as s:  # accepted for good
            assert len(await everything(s)) == 3

    async def test_an_index_write_that_fails_after_the_log_write_still_acknowledges(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        log = tmp_path / "log.ndjson"
        async with await NdjsonLog.open(log, durability=self.durability) as s:
            await s.append("s", [new(i=0)])

            def full(self: IndexFile, records: bytes, at_count: int) -> None:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

            with monkeypatch.context() as m:
                m.setattr(IndexFile, "write_at", full)
                landed = await s.append("s", [new(i=1), new(i=2)], 1)
            assert [e.position for e in landed] == [2, 3]
            assert (await everything(s))[1:] == landed
            assert await stream_events(s, "s", 2) == landed
            more = await s.append("s", [new(i=3)], 3)
            assert more[0].position == 4
        async with await NdjsonLog.open(log, durability=self.durability) as s:
            assert (await everything(s))[1:3] == landed
            report = await s.verify()
            assert report.ok, report.problems

    async def test_swapped_index_records_are_detected(self, tmp_path: Path) -> None:
        log = tmp_path / "log.ndjson"
        async with await NdjsonLog.open(log, durability=self.durability) as s:
            for i in range(6):
                await s.append("s", [new(i=i)])
                await s.append("t", [new(i=i)])
            truth = await stream_events(s, "s")
        idx = log.with_name(log.name + ".idx")
        data = bytearray(idx.read_bytes())
        size = len(data) // 12
        a, b = 2, 6  # positions 3 and 7: versions 2 and 4 of "s"
        data[a * size : (a + 1) * size], data[b * size : (b + 1) * size] = (
            data[b * size : (b + 1) * size],
            data[a * size : (a + 1) * size],
        )
        idx.write_bytes(bytes(data))
        async with await NdjsonLog.open(log, durability=self.durability) as s:
            report = await s.verify()
            assert any("index" in p for p in report.problems), report.problems
            got = await stream_events(s, "s")
            assert [e.version for e in got] == [1, 2, 3, 4, 5, 6]
            assert got == truth
            assert_log_invariants(await everything(s))

    async def test_a_zeroed_id_in_the_index_does_not_let_an_event_in_twice(self, tmp_path: Path) -> None:
        log = tmp_path / "log.ndjson"
        events = [new(i=i) for i in range(4)]
        async with await NdjsonLog.open(log, durability=self.durability) as s:
            recorded = [(await s.append("s", [e]))[0] for e in events]
        idx = log.with_name(log.name + ".idx")
        data = bytearray(idx.read_bytes())
        size = len(data) // 4
        data[size + 32 : size + 40] = bytes(8)  # the event-id key of position 2
        idx.write_bytes(bytes(data))
        async with await NdjsonLog.open(log, durability=self.durability) as s:
            again = await s.append("s", [events[1]])
            assert again == [recorded[1]]
            assert await s.head() == 4
            assert_log_invariants(await everything(s))

    @pytest.mark.parametrize("edit", ["same-length", "longer"])
    async def test_an_edited_payload_that_stays_valid_json_is_detected(
        self, tmp_path: Path, edit: str
    ) -> None:
        log = tmp_path / "log.ndjson"
        async with await NdjsonLog.open(log, durability=self.durability) as s:
            for i in range(3):
                await s.append("s", [new(i=i)])
        raw = log.read_bytes()
        edited = raw.replace(b'{"i":1}', b'{"i":7}' if edit == "same-length" else b'{"i":1000}')
        assert edited != raw
        log.write_bytes(edited)
        async with await NdjsonLog.open(log, durability=self.durability) as s:
            report = await s.verify()
            assert not report.ok
            assert any("line 2" in p and "checksum" in p for p in report.problems), report.problems
            with pytest.raises(CorruptLogError):
                await stream_events(s, "s")
            with pytest.raises(CorruptLogError) as info:
                await everything(s)
            assert info.value.line == 2
            report = await s.verify(repair=True)
            assert report.ok, report.problems
            assert [e.data_dict() for e in await stream_events(s, "s")][1] != {"i": 1}
        assert log.read_bytes() == edited

    async def test_one_stream_operations_cost_the_stream_not_the_log(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Bytes read by a 5-event stream read, ``read_all(from, limit=1)`` and the first append after open
        stay the same when the log grows tenfold (issue 9 item 7)."""

        async def cost(total: int) -> dict[str, int]:
            log = tmp_path / f"log-{total}.ndjson"
            async with await NdjsonLog.open(log, durability="none") as s:
                for i in range(0, total, 100):
                    if i % (total // 5) == 0:
                        await s.append("probe", [new(i=i)])
                    await s.append(f"s{i // 100}", [new(i=k) for k in range(100)])
            read = 0
            real = os.pread

            def counting(fd: int, n: int, offset: int) -> bytes:
                nonlocal read
                data = real(fd, n, offset)
                read += len(data)
                return data

            out: dict[str, int] = {}
            async with await NdjsonLog.open(log, durability=self.durability) as s:
                with monkeypatch.context() as m:
                    m.setattr(os, "pread", counting)
                    for what in ("stream", "bounded", "append"):
                        read = 0
                        if what == "stream":
                            assert len(await stream_events(s, "probe")) == 5
                        elif what == "bounded":
                            assert len([e async for e in s.read_all(total // 2, limit=1)]) == 1
                        else:
                            await s.append("fresh", [new(i=-1)])
                        out[what] = read
            return out

        small, big = await cost(2_000), await cost(20_000)
        for what in small:
            assert big[what] <= small[what] * 1.5 + 4096, (what, small, big)

    def test_cli_refuses_a_file_that_is_not_a_log(self, tmp_path: Path) -> None:
        notes = tmp_path / "notes.txt"
        notes.write_bytes(b"hello")
        result = subprocess.run(
            [sys.executable, "-m", "loopd_es", "--store", f"ndjson:{notes}", "append", "--stream", "goal-1",
             "--type", "goal.paused", "--data", '{"goal_id":"g1"}'],
            check=False, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert result.returncode == 4, result
        assert "not a loopd-es log" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
        assert notes.read_bytes() == b"hello"
        assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_id_time_range_takes_the_string_order_shortcut_only_when_it_is_right() -> None:
    import random
    import uuid

    from loopd_es.events.envelope import new_event_id
    from loopd_es.log.ndjson_files import id_time, id_time_range

    rng = random.Random(9)
    for _ in range(500):
        ids = [new_event_id() for _ in range(rng.randint(1, 4))]
        if rng.random() < 0.3:
            ids.append(str(uuid.UUID(int=rng.getrandbits(128), version=4)))
        if rng.random() < 0.3:
            ids[0] = ids[0].upper()
        times = [id_time(i) for i in ids]
        assert id_time_range(ids) == (min(times), max(times)), ids


_DIE_BEFORE_SYNC = """
import os, signal, sys
import anyio
from pathlib import Path
from loopd_es.events.envelope import NewEvent
from loopd_es.log.ndjson import NdjsonLog

async def main() -> None:
    store = await NdjsonLog.open(Path(sys.argv[1]))
    os.fdatasync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)
    await store.append("s", [NewEvent(type="t.x", data={"i": 1}), NewEvent(type="t.x", data={"i": 2})])

anyio.run(main)
"""


class TestNdjsonLogNoFsync(TestNdjsonLog):
    durability = "none"


class TestNdjsonLogBatchDurability(TestNdjsonLog):
    durability = "batch"
