"""The log contract on the in-memory reference backend: it must pass every test the durable backends pass."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

import pytest

from loopd_es.errors import LogNotFoundError
from loopd_es.log import open_store
from loopd_es.log.memory import MemoryLog
from loopd_es.testing import LogStoreContract, new

if TYPE_CHECKING:
    from loopd_es.log.base import LogStore

pytestmark = pytest.mark.anyio


class TestMemoryLog(LogStoreContract):
    @pytest.fixture
    def store_url(self) -> Iterator[str]:
        name = f"contract-{uuid.uuid4().hex}"
        yield f"memory:{name}"
        MemoryLog.forget(name)

    @pytest.fixture
    async def store(self, store_url: str) -> AsyncIterator[LogStore]:
        async with await open_store(store_url) as s:
            yield s

    # -- memory only -------------------------------------------------------------------------------

    async def test_open_store_url_gives_this_backend(self, store_url: str) -> None:
        async with await open_store(store_url) as s:
            assert isinstance(s, MemoryLog) and s.url == store_url

    async def test_a_missing_log_is_not_created_by_a_reader(self) -> None:
        with pytest.raises(LogNotFoundError):
            await open_store(f"memory:absent-{uuid.uuid4().hex}", create=False)

    async def test_forget_starts_afresh(self, store: LogStore, store_url: str) -> None:
        await store.append("s", [new()])
        MemoryLog.forget(store_url.split(":", 1)[1])
        async with await open_store(store_url) as fresh:
            assert await fresh.head() == 0
