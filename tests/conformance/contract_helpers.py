"""Helpers shared by the contract's parts: building events and reading a whole log back."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loopd_es.events.envelope import Envelope, NewEvent

if TYPE_CHECKING:
    from loopd_es.log.base import LogStore


def new(type_: str = "test.happened", /, **data: Any) -> NewEvent:
    """A new event with a fresh id and ``data`` as its payload."""
    return NewEvent(type=type_, data=data)


async def everything(store: LogStore) -> list[Envelope]:
    return [e async for e in store.read_all()]


async def stream_events(
    store: LogStore, stream: str, from_version: int = 1, limit: int | None = None
) -> list[Envelope]:
    return [e async for e in store.read_stream(stream, from_version, limit)]


async def batches(store: LogStore, **kwargs: Any) -> list[list[Envelope]]:
    return [b async for b in store.read_batches(**kwargs)]


def flat(bs: list[list[Envelope]]) -> list[Envelope]:
    return [e for b in bs for e in b]


def positions(envs: list[Envelope]) -> list[int]:
    return [e.position for e in envs]


def assert_log_invariants(envs: list[Envelope]) -> None:
    """Gapless positions from 1, contiguous versions per stream, unique event ids."""
    assert positions(envs) == list(range(1, len(envs) + 1))
    versions: dict[str, int] = {}
    for e in envs:
        versions[e.stream] = versions.get(e.stream, 0) + 1
        assert e.version == versions[e.stream], f"position {e.position}: stream {e.stream!r} version gap"
    ids = [e.event_id for e in envs]
    assert len(ids) == len(set(ids)), "duplicate event ids in the log"
