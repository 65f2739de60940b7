"""Integrity promises every backend keeps (issue 9): odd payload bytes, torn writes, foreign files.

``IntegrityContract`` is a mixin (no ``Test`` prefix): ``TestNdjsonLog`` and ``TestSqliteLog`` add it to their
bases, so each test here runs against both backends through their ``store`` and ``store_url`` fixtures.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import pytest

from loopd_es.errors import StorageError, UsageError
from loopd_es.events.envelope import NewEvent
from loopd_es.log import open_store

from .contract import assert_log_invariants, everything, new

if TYPE_CHECKING:
    from loopd_es.log.base import LogStore


class IntegrityContract:
    """Mixed into each backend's test class next to ``LogStoreContract``."""

    # -- item 3: raw payload bytes ------------------------------------------------------------------

    @pytest.mark.parametrize(
        ("raw", "value"),
        [
            (b'{"a":\n1}', {"a": 1}),
            (b'{"a":1}\r\n', {"a": 1}),
            (b'\r{"a":"x"}', {"a": "x"}),
            (b' {\r"a" : [1,\n2], "b": "\\n"}\n', {"a": [1, 2], "b": "\n"}),
        ],
        ids=["newline-between-tokens", "crlf-after", "cr-before", "mixed"],
    )
    async def test_raw_line_breaks_never_reach_the_log(
        self, store: LogStore, store_url: str, raw: bytes, value: dict[str, object]
    ) -> None:
        recorded = await store.append(
            "raw",
            [new(i=0), NewEvent(type="t.raw", data=raw), NewEvent(type="t.bytes", data=msgspec.Raw(raw))],
        )
        for env in recorded[1:]:
            assert b"\n" not in bytes(env.data) and b"\r" not in bytes(env.data)
            assert env.data_dict() == value
        again = await store.append("raw", [NewEvent(type="t.raw", data=raw, event_id=recorded[1].event_id)])
        assert again == [recorded[1]], "a retry of the same raw bytes returns the original"
        assert await everything(store) == recorded
        report = await store.verify()
        assert report.ok, report.problems
        async with await open_store(store_url) as other:  # another process's view, from the files alone
            assert await everything(other) == recorded
            more = await other.append("raw", [new(i=4)], 3)
            assert more[0].position == 4
        assert [e.position for e in await everything(store)] == [1, 2, 3, 4]

    @pytest.mark.parametrize(
        "raw",
        [b'{"a":1}\n{"b":2}', b'{"a":"x\ny"}', b'{"a":1', b"[1]", b'{"a":1} x', b"\xff", b'{"\xff":1}', b"", b"null"],
        ids=["two-objects", "newline-in-string", "truncated", "array", "trailing-garbage", "not-utf8",
             "not-utf8-key", "empty", "null"],
    )  # fmt: skip
    async def test_raw_payload_that_is_not_one_object_is_refused(self, store: LogStore, raw: bytes) -> None:
        await store.append("s", [new(i=1)])
        for data in (raw, msgspec.Raw(raw)):
            with pytest.raises(UsageError):
                await store.append("s", [new(i=2), NewEvent(type="t.raw", data=data)])
        recorded = await everything(store)
        assert len(recorded) == 1
        assert_log_invariants(recorded)
        assert (await store.verify()).ok

    # -- item 12: foreign files -------------------------------------------------------------------

    @pytest.mark.parametrize("content", [b"my notes\nline two\n", b"hello", b"{}\n", b'{"a": 1}'])
    @pytest.mark.parametrize("create", [True, False])
    async def test_a_file_that_is_not_a_log_is_refused_and_left_alone(
        self, store_url: str, tmp_path: Path, content: bytes, create: bool
    ) -> None:
        """``--store ndjson:notes.txt append`` (or read) must not replace, extend or sit next to notes.txt."""
        folder = tmp_path / "elsewhere"
        folder.mkdir()
        notes = folder / "notes.txt"
        notes.write_bytes(content)
        url = f"{store_url.split(':', 1)[0]}:{notes}"
        with pytest.raises(StorageError) as info:
            store = await open_store(url, create=create)
            async with store:
                await store.append("s", [new(i=1)])
        assert info.value.exit_code == 4
        assert notes.read_bytes() == content
        assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]
