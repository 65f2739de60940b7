"""The in-memory reference backend: the contract and nothing else, for fast unit tests and backend authors.

``memory:NAME`` opens a log that lives as long as the process; every store opened on the same name shares it,
so reopening sees what was appended. Appends go through the same group commit as the durable backends (one
caller's failure stays its own, cancellation never strands anyone), and a commit is a few list operations
that run without awaiting, so it is atomic. Nothing is ever written to disk.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Final

import anyio.lowlevel
import msgspec

from ..clock import now_rfc3339
from ..errors import LoopdError, StorageError, UsageError
from ..events.envelope import Envelope
from .base import (
    READ_BATCH,
    LogStore,
    check_expected_version,
)
from .coord import Claim, check_swap, failed_fence, swap_in, with_prefix
from .group_commit import GroupCommitter, Request
from .invariants import SequenceChecker, VerifyReport

_Raw: Final = msgspec.Raw


class _Shared:
    """One named log: the envelopes in order, each stream's positions, and the event ids."""

    def __init__(self) -> None:
        self.events: list[Envelope] = []
        self.streams: dict[str, list[int]] = {}
        self.ids: dict[str, Envelope] = {}
        self.coord: dict[str, Claim] = {}


_LOGS: dict[str, _Shared] = {}


class MemoryLog(LogStore):
    """An append-only log held in this process's memory (see the module docstring)."""

    def __init__(self, name: str) -> None:
        self.url = f"memory:{name}"
        self._log = _LOGS.setdefault(name, _Shared())
        self._group = GroupCommitter(self._commit)
        self._closed = False

    @classmethod
    async def open(cls, name: str, *, create: bool = True) -> MemoryLog:
        """Open the log called ``name`` (shared by every store of this process opened on it).

        :raises LogNotFoundError: when there is no such log yet and ``create`` is false.
        """
        from ..errors import LogNotFoundError

        if not create and name not in _LOGS:
            raise LogNotFoundError(f"memory:{name}")
        return cls(name)

    @staticmethod
    def forget(name: str) -> None:
        """Drop the log called ``name`` (tests call this to start afresh)."""
        _LOGS.pop(name, None)

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(f"{self.url} is closed; open the store again")

    # -- writing ------------------------------------------------------------------------------------

    async def _submit(self, request: Request) -> list[Envelope]:
        self._check_open()
        return await self._group.submit(request)

    async def _commit(self, group: list[Request]) -> None:
        self._check_open()
        for request in group:
            try:
                request.result = self._commit_one(request)
            except LoopdError as e:
                request.error = e

    def _commit_one(self, request: Request) -> list[Envelope]:
        log = self._log
        if request.fences and (lost := failed_fence(request.fences, log.coord)) is not None:
            raise lost
        retried = request.retry_result([log.ids.get(new.event_id) for new in request.all_events])
        if retried is not None:
            return retried
        for part in request.parts:  # every check before anything is staged: all or none
            check_expected_version(part.stream, part.expected, len(log.streams.get(part.stream, ())))
        recorded_at = now_rfc3339()
        envelopes = []
        position = len(log.events)
        for stream, events, _expected, payloads in request.parts:
            version = len(log.streams.get(stream, ()))
            for new, data in zip(events, payloads, strict=True):
                position += 1
                version += 1
                envelopes.append(
                    Envelope(
                        position,
                        stream,
                        version,
                        new.event_id,
                        new.type,
                        new.schema_version,
                        recorded_at,
                        new.causation_id,
                        new.correlation_id,
                        _Raw(data),
                    )
                )
        self._record(envelopes)
        return envelopes

    def _record(self, envelopes: list[Envelope]) -> None:
        log = self._log
        for env in envelopes:
            log.events.append(env)
            log.streams.setdefault(env.stream, []).append(env.position)
            log.ids[env.event_id] = env

    # -- coordination -------------------------------------------------------------------------------

    async def coord_read(self, prefix: str = "") -> list[Claim]:
        self._check_open()
        await anyio.lowlevel.checkpoint()
        return with_prefix(self._log.coord.values(), prefix)

    async def coord_swap(self, key: str, expected_token: int, new: Claim | None) -> Claim | None:
        self._check_open()
        check_swap(key, expected_token, new)
        await anyio.lowlevel.checkpoint()
        return swap_in(self._log.coord, key, expected_token, new)

    # -- reading ------------------------------------------------------------------------------------

    async def read_batches(
        self,
        *,
        from_position: int = 1,
        limit: int | None = None,
        stream: str | None = None,
        from_version: int = 1,
    ) -> AsyncIterator[list[Envelope]]:
        self._check_open()
        log = self._log
        if stream is None:
            start = max(from_position, 1) - 1
            stop = len(log.events) if limit is None else min(len(log.events), start + limit)
            for i in range(start, stop, READ_BATCH):
                yield log.events[i : min(i + READ_BATCH, stop)]
                await anyio.lowlevel.checkpoint()
            return
        positions = log.streams.get(stream, [])
        start = max(from_version, 1) - 1
        stop = len(positions) if limit is None else min(len(positions), start + limit)
        for i in range(start, stop, READ_BATCH):
            yield [log.events[p - 1] for p in positions[i : min(i + READ_BATCH, stop)]]
            await anyio.lowlevel.checkpoint()

    async def head(self) -> int:
        self._check_open()
        return len(self._log.events)

    async def stream_version(self, stream: str) -> int:
        self._check_open()
        return len(self._log.streams.get(stream, ()))

    async def streams(self) -> list[str]:
        self._check_open()
        return sorted(self._log.streams)

    async def verify(self, *, repair: bool = False) -> VerifyReport:
        self._check_open()
        report = VerifyReport(self.url)
        checker = SequenceChecker(self.url)
        for env in self._log.events:
            try:
                checker.check(env)
            except LoopdError as e:
                report.problems.append(str(e))
                break
        report.events, report.streams = len(self._log.events), len(self._log.streams)
        return report

    async def import_envelopes(self, batches: AsyncIterator[list[Envelope]]) -> int:
        self._check_open()
        if self._log.events:
            raise UsageError(
                f"{self.url} is not empty ({len(self._log.events)} events); import only into a new log"
            )
        checker = SequenceChecker(self.url)
        copied: list[Envelope] = []
        async for batch in batches:
            for env in batch:
                checker.check(env)
            copied.extend(batch)
        if self._log.events:
            raise UsageError(f"{self.url} was appended to during the import; import only into a new log")
        self._record(copied)
        return checker.position

    async def aclose(self) -> None:
        self._closed = True
