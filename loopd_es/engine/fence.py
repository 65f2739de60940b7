"""The fence: every event the engine appends lands together with its lease token, or not at all.

:class:`FencedStore` is the log as the engine sees it. Each append becomes one atomic ``append_many`` of the
engine's events *and* an ``engine.fenced`` event (holder, fencing token) on the lease stream, at the lease
stream version this holder last wrote. Once another process takes the lease (which moves that version), every
write of the old holder fails as a whole, even one it had decided and checked the lease for a moment before:
the check is inside the same transaction as the write. Resending events already recorded (an idempotent
retry) writes nothing and needs no fence.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

from ..domain.provider_limit import iso
from ..errors import DuplicateEventIdError, WrongExpectedVersionError
from ..events import engine as en
from ..events.catalogue import new_event
from ..events.envelope import ANY
from ..log.base import LogStore, StreamWrite, WriteSpec
from .lease import STREAM as LEASE_STREAM
from .lease import LeaseLostError

if TYPE_CHECKING:
    from ..events.envelope import Envelope, ExpectedVersion, NewEvent
    from ..log.base import VerifyReport
    from ..log.group_commit import Request
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


class FencedStore(StoreView):
    """A log whose appends carry this holder's lease token atomically (reads pass through)."""

    def __init__(self, inner: LogStore, lease: Lease) -> None:
        super().__init__(inner)
        self.lease = lease

    async def append(
        self, stream: str, events: Sequence[NewEvent], expected_version: ExpectedVersion = ANY
    ) -> list[Envelope]:
        if not events or stream == LEASE_STREAM:
            return await self.inner.append(stream, events, expected_version)
        recorded = await self._fenced([StreamWrite(stream, events, expected_version)])
        return (
            recorded[0] if recorded is not None else await self.inner.append(stream, events, expected_version)
        )

    async def append_many(self, writes: Sequence[WriteSpec]) -> list[list[Envelope]]:
        """Several streams at once (a saga step and the goal event it causes), fenced like :meth:`append`."""
        checked = [StreamWrite(*write) for write in writes]
        if any(w.stream == LEASE_STREAM for w in checked):
            return await self.inner.append_many(checked)
        recorded = await self._fenced(checked)
        return recorded if recorded is not None else await self.inner.append_many(checked)

    async def _submit(self, request: Request) -> list[Envelope]:
        writes = [StreamWrite(part.stream, part.events, part.expected) for part in request.parts]
        if any(w.stream == LEASE_STREAM for w in writes):
            return [env for out in await self.inner.append_many(writes) for env in out]
        recorded = await self._fenced(writes)
        if recorded is None:
            recorded = await self.inner.append_many(writes)
        return [env for out in recorded for env in out]

    async def _fenced(self, writes: list[StreamWrite]) -> list[list[Envelope]] | None:
        """Append ``writes`` with this holder's fence in one transaction; ``None`` when every event was already
        recorded (a retry: nothing new is written, so there is nothing to fence, and the caller resends plain)."""
        lease = self.lease
        async with lease.lock:  # a renewal meanwhile would move the version this write is fenced on
            if lease.token is None or lease.expires_at is None:
                raise LeaseLostError(f"{lease.holder} does not hold the engine lease")
            # the transaction below refuses a stale fence; checking first as well keeps a backend whose multi-stream
            # append does not (NDJSON as merged on 2026-12-02) from writing after a takeover it can see
            await lease.check()
            fence = en.EngineFenced(
                holder=lease.holder,
                token=lease.token,
                expires_at=iso(lease.expires_at),
                stream=writes[0].stream,
            )
            try:
                *recorded, _ = await self.inner.append_many(
                    [*writes, StreamWrite(LEASE_STREAM, [new_event(fence)], lease.version)]
                )
            except WrongExpectedVersionError:
                if await self.inner.stream_version(LEASE_STREAM) != lease.version:
                    raise LeaseLostError(
                        f"engine lease of {lease.holder} was taken by another process"
                    ) from None
                raise
            except DuplicateEventIdError:
                return None  # recorded before (a retry after a crash or by another path)
            lease.version += 1
            return recorded
