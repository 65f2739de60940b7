"""The fence: every event the engine appends lands only while this engine still holds the lease.

:class:`FencedStore` is the log as the engine sees it. Each append carries a :class:`~loopd_es.log.coord.Fence`
on the lease record at this holder's token, which the store checks in the append's own transaction and which
writes nothing. Once another process takes the lease (which moves the token), every write of the old holder
fails as a whole, even one it had decided and checked the lease for a moment before.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

from ..events.envelope import ANY
from ..log.base import LogStore, StreamWrite, WriteSpec
from ..log.coord import Fence, FenceLostError
from .lease import KEY as LEASE_KEY
from .lease import LeaseLostError

if TYPE_CHECKING:
    from ..events.envelope import Envelope, ExpectedVersion, NewEvent
    from ..log.coord import Claim
    from ..log.group_commit import Request
    from ..log.invariants import VerifyReport
    from .lease import Lease


class StoreView(LogStore):
    """The engine's view of a log: reads pass through to ``inner``; subclasses fence the appends."""

    def __init__(self, inner: LogStore) -> None:
        self.inner = inner
        self.url = inner.url

    def read_batches(
        self,
        *,
        from_position: int = 1,
        limit: int | None = None,
        stream: str | None = None,
        from_version: int = 1,
    ) -> AsyncIterator[list[Envelope]]:
        return self.inner.read_batches(
            from_position=from_position, limit=limit, stream=stream, from_version=from_version
        )

    def read_filtered(
        self,
        *,
        from_position: int = 1,
        limit: int | None = None,
        types: Sequence[str] | None = None,
        stream_prefix: str | None = None,
    ) -> AsyncIterator[list[Envelope]]:
        return self.inner.read_filtered(
            from_position=from_position, limit=limit, types=types, stream_prefix=stream_prefix
        )

    async def head(self) -> int:
        return await self.inner.head()

    async def coord_read(self, prefix: str = "") -> list[Claim]:
        return await self.inner.coord_read(prefix)

    async def coord_swap(self, key: str, expected_token: int, new: Claim | None) -> Claim | None:
        return await self.inner.coord_swap(key, expected_token, new)

    async def stream_version(self, stream: str) -> int:
        return await self.inner.stream_version(stream)

    async def streams(self) -> list[str]:
        return await self.inner.streams()

    async def verify(self, *, repair: bool = False) -> VerifyReport:
        return await self.inner.verify(repair=repair)

    async def import_envelopes(self, batches: AsyncIterator[list[Envelope]]) -> int:
        return await self.inner.import_envelopes(batches)

    async def aclose(self) -> None:
        """The inner store belongs to whoever opened it; closing the view closes nothing."""

    # every append goes through ``append_many``, which a fencing view overrides with its own fences

    async def append(
        self,
        stream: str,
        events: Sequence[NewEvent],
        expected_version: ExpectedVersion = ANY,
        *,
        fences: Sequence[Fence] = (),
    ) -> list[Envelope]:
        (recorded,) = await self.append_many([StreamWrite(stream, events, expected_version)], fences=fences)
        return recorded

    async def append_many(
        self, writes: Sequence[WriteSpec], *, fences: Sequence[Fence] = ()
    ) -> list[list[Envelope]]:
        checked = [StreamWrite(*write) for write in writes]
        if not any(w.events for w in checked):
            return [[] for _ in checked]
        return await self._fenced(checked, fences)

    async def _fenced(self, writes: list[StreamWrite], fences: Sequence[Fence]) -> list[list[Envelope]]:
        """Append ``writes`` (some events in them) with the view's fences added to ``fences``."""
        return await self.inner.append_many(writes, fences=fences)

    async def _submit(self, request: Request) -> list[Envelope]:
        writes = [StreamWrite(part.stream, part.events, part.expected) for part in request.parts]
        return [env for out in await self.append_many(writes, fences=request.fences) for env in out]


class FencedStore(StoreView):
    """A log whose appends carry this holder's lease token as a fence (reads pass through)."""

    def __init__(self, inner: LogStore, lease: Lease) -> None:
        super().__init__(inner)
        self.lease = lease

    async def _fenced(self, writes: list[StreamWrite], fences: Sequence[Fence]) -> list[list[Envelope]]:
        lease = self.lease
        lease.check_clock()  # a holder past its own lease stops even before the store would refuse it
        assert lease.token is not None
        try:
            return await self.inner.append_many(writes, fences=[*fences, Fence(LEASE_KEY, lease.token)])
        except FenceLostError as e:
            if e.fence.key != LEASE_KEY:
                raise
            lease.token = lease.expires_at = None
            raise LeaseLostError(f"engine lease of {lease.holder} was taken by another process") from None
