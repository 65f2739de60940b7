"""Coordination records and fenced appends (:mod:`loopd_es.log.coord`): part of every backend's contract."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import pytest

from ..errors import UsageError
from ..log.coord import Claim, Fence, FenceLostError
from .helpers import everything, new

if TYPE_CHECKING:
    from ..log.base import LogStore


def _claim(key: str, holder: str, token: int, expires_us: int = 10**15, info: str = "") -> Claim:
    return Claim(key=key, holder=holder, token=token, expires_us=expires_us, info=info)


class CoordContract:
    """Compare-and-set records beside the log, and appends fenced on them."""

    async def test_no_records_at_first(self, store: LogStore) -> None:
        assert await store.coord_read() == []
        assert await store.coord_read("lease/") == []

    async def test_swap_creates_renews_and_reads_back(self, store: LogStore) -> None:
        first = _claim("lease/engine", "a", 1, info='{"pid": 1}')
        assert await store.coord_swap("lease/engine", 0, first) is None
        assert await store.coord_read("lease/") == [first]
        renewed = _claim("lease/engine", "a", 1, expires_us=2 * 10**15)
        assert await store.coord_swap("lease/engine", 1, renewed) is None
        assert await store.coord_read() == [renewed]

    async def test_a_stale_swap_changes_nothing_and_names_the_winner(self, store: LogStore) -> None:
        await store.coord_swap("k", 0, _claim("k", "a", 1))
        winner = _claim("k", "b", 2)
        assert await store.coord_swap("k", 1, winner) is None
        found = await store.coord_swap("k", 1, _claim("k", "c", 2))
        assert found == winner
        found = await store.coord_swap("k", 0, _claim("k", "c", 1))
        assert found == winner
        assert await store.coord_read() == [winner]

    async def test_expecting_a_record_that_is_absent_fails(self, store: LogStore) -> None:
        found = await store.coord_swap("absent", 3, _claim("absent", "a", 4))
        assert found is not None and found.token == 0 and found.holder == ""
        assert await store.coord_read() == []

    async def test_delete_and_prefix_reads(self, store: LogStore) -> None:
        for key in ("member/b", "member/a", "claim/g1", "memberz"):
            assert await store.coord_swap(key, 0, _claim(key, "x", 1)) is None
        assert [c.key for c in await store.coord_read("member/")] == ["member/a", "member/b"]
        assert await store.coord_swap("member/a", 2, None) is not None  # wrong token: kept
        assert await store.coord_swap("member/a", 1, None) is None
        assert [c.key for c in await store.coord_read("member")] == ["member/b", "memberz"]
        assert [c.key for c in await store.coord_read()] == ["claim/g1", "member/b", "memberz"]

    async def test_one_of_many_contenders_wins(self, store: LogStore) -> None:
        won: list[str] = []

        async def contend(name: str) -> None:
            if await store.coord_swap("lease", 0, _claim("lease", name, 1)) is None:
                won.append(name)

        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(contend, f"c{i}")
        assert len(won) == 1
        assert [c.holder for c in await store.coord_read()] == won

    async def test_invalid_records_are_refused(self, store: LogStore) -> None:
        for key in ("", "a\x00b", "x" * 201):
            with pytest.raises(UsageError):
                await store.coord_swap(key, 0, None)
        with pytest.raises(UsageError):
            await store.coord_swap("k", 0, _claim("other", "a", 1))
        with pytest.raises(UsageError):
            await store.coord_swap("k", -1, None)
        with pytest.raises(UsageError):
            await store.append("s", [new()], fences=[Fence("k", 0)])
        assert await store.coord_read() == []
        assert await store.head() == 0

    async def test_a_fenced_append_lands_while_the_token_holds(self, store: LogStore) -> None:
        await store.coord_swap("lease", 0, _claim("lease", "a", 1))
        await store.append("s", [new()], fences=[Fence("lease", 1)])
        await store.coord_swap("lease", 1, _claim("lease", "a", 1, expires_us=5))  # a renewal keeps the token
        await store.append_many([("s", [new()]), ("t", [new()])], fences=[Fence("lease", 1)])
        assert await store.head() == 3
        assert [c.token for c in await store.coord_read()] == [1]  # the fence wrote nothing

    async def test_a_stale_fence_writes_nothing(self, store: LogStore) -> None:
        await store.coord_swap("lease", 0, _claim("lease", "a", 1))
        await store.append("s", [new()])
        await store.coord_swap("lease", 1, _claim("lease", "b", 2))  # taken over
        with pytest.raises(FenceLostError) as caught:
            await store.append("s", [new()], fences=[Fence("lease", 1)])
        assert caught.value.actual is not None and caught.value.actual.holder == "b"
        assert "nothing was written" in str(caught.value)
        with pytest.raises(FenceLostError):
            await store.append_many(
                [("s", [new()]), ("t", [new()])], fences=[Fence("lease", 2), Fence("c", 1)]
            )
        with pytest.raises(FenceLostError):
            await store.append("s", [new()], fences=[Fence("absent", 1)])
        assert len(await everything(store)) == 1

    async def test_a_stale_fence_fails_only_its_own_request_in_a_group(self, store: LogStore) -> None:
        await store.coord_swap("lease", 0, _claim("lease", "b", 2))
        outcomes: dict[str, str] = {}

        async def write(name: str, fences: list[Fence]) -> None:
            try:
                await store.append(name, [new()], fences=fences)
                outcomes[name] = "ok"
            except FenceLostError:
                outcomes[name] = "lost"

        async with anyio.create_task_group() as tg:  # started together: one group commit
            tg.start_soon(write, "plain", [])
            tg.start_soon(write, "stale", [Fence("lease", 1)])
            tg.start_soon(write, "fresh", [Fence("lease", 2)])
        assert outcomes == {"plain": "ok", "stale": "lost", "fresh": "ok"}
        assert sorted(env.stream for env in await everything(store)) == ["fresh", "plain"]
