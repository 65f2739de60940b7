"""Fire records: who is firing a session's (or a goal schedule's) slot right now, and until when.

That is coordination, not history (#21): it lives in a coordination record beside the log
(:mod:`loopd_es.log.coord`), one per session (``loop/fire/session/<id>``) and one per goal schedule
(``loop/fire/goal/<id>``), never in an event. A scheduler:

1. takes the record over if nobody holds it live (compare-and-set on the token it read: of two contenders one
   wins, so one injection per session at a time);
2. appends ``loop.slot_claimed`` at the stream's expected version, fenced on its token (a slot fires once);
3. renews the record while the host call lasts (:func:`renewing`);
4. appends the outcome fenced on the same token, then releases the record (the token stays, so no token is
   ever handed out twice for a key).

A scheduler that stops or stalls past its record loses it: another takes the record over, records the fire as
lost (``loop.fire_failed`` ``claimer-lost``, fenced on the new token), and the stalled one can land nothing
after that. What the record names goes in its ``info`` as JSON (task, slot, attempt).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Final

import anyio
import msgspec

from ..clock import from_us, to_us
from ..domain.loop.model import InFlight
from ..errors import StorageError
from ..log.coord import Claim, Fence

if TYPE_CHECKING:
    from datetime import datetime

    from ..clock import Clock
    from ..log.base import LogStore

PREFIX: Final = "loop/fire/"
SESSION_PREFIX: Final = PREFIX + "session/"
GOAL_PREFIX: Final = PREFIX + "goal/"
log = logging.getLogger(__name__)


def session_key(session_id: str) -> str:
    """The fire record of one session's ``/loop`` tasks."""
    return SESSION_PREFIX + session_id


def goal_key(goal_id: str) -> str:
    """The fire record of one goal's schedule."""
    return GOAL_PREFIX + goal_id


class _Names(msgspec.Struct, frozen=True):
    task_id: str
    slot: int
    attempt: int


_DECODE: Final = msgspec.json.Decoder(_Names)
_ENCODE: Final = msgspec.json.Encoder()


def in_flight(record: Claim | None) -> InFlight | None:
    """What a record says is being fired, for the deciders; ``None`` when nobody holds it or it names nothing."""
    if record is None or not record.holder or not record.info:
        return None
    try:
        names = _DECODE.decode(record.info)
    except msgspec.DecodeError:
        return None  # not a record this version wrote: treated as naming no fire (its expiry still counts)
    return InFlight(
        task_id=names.task_id, slot=names.slot, attempt=names.attempt, until=from_us(record.expires_us)
    )


def busy(record: Claim | None, now: datetime) -> bool:
    """Whether someone holds ``record`` live at ``now`` (whatever it names)."""
    return record is not None and record.live(to_us(now))


@dataclass(frozen=True, slots=True)
class Hold:
    """A fire record this scheduler holds: ``token`` fences its writes; ``until`` is when it runs out."""

    key: str
    holder: str
    token: int
    info: str
    until: datetime

    @property
    def fence(self) -> Fence:
        return Fence(self.key, self.token)

    def record(self, until: datetime) -> Claim:
        return Claim(
            key=self.key, holder=self.holder, token=self.token, expires_us=to_us(until), info=self.info
        )


async def take(
    store: LogStore,
    key: str,
    seen: Claim | None,
    *,
    holder: str,
    now: datetime,
    ttl_ms: int,
    names: tuple[str, int, int] | None = None,
) -> Hold | Claim:
    """Take record ``key`` over from ``seen`` (the record as last read; ``None``: none) unless it is held live.

    ``names`` is the ``(task, slot, attempt)`` about to be fired (none: the record is taken to record lost
    fires). Returns the :class:`Hold`, or the record that stands in the way (held live, or changed since it
    was read: the caller reads again).
    """
    if seen is not None and busy(seen, now):
        return seen
    token = seen.token if seen is not None else 0
    info = "" if names is None else _ENCODE.encode(_Names(*names)).decode()
    hold = Hold(
        key=key, holder=holder, token=token + 1, info=info, until=now + timedelta(milliseconds=ttl_ms)
    )
    found = await store.coord_swap(key, token, hold.record(hold.until))
    return hold if found is None else found


async def renew(store: LogStore, hold: Hold, now: datetime, ttl_ms: int) -> Hold | None:
    """Extend ``hold`` to ``now + ttl_ms``; ``None`` when it was taken over meanwhile (the fire is lost)."""
    until = now + timedelta(milliseconds=ttl_ms)
    found = await store.coord_swap(hold.key, hold.token, hold.record(until))
    return replace(hold, until=until) if found is None else None


async def release(store: LogStore, hold: Hold) -> bool:
    """Let go of ``hold`` (keeping its token, so a later holder's is higher); ``False`` if it was taken over."""
    free = Claim(key=hold.key, holder="", token=hold.token, expires_us=0)
    return await store.coord_swap(hold.key, hold.token, free) is None


@dataclass(slots=True)
class Keeper:
    """The state of a :func:`renewing` block: the latest hold, and whether it was lost."""

    hold: Hold
    lost: bool = False


@asynccontextmanager
async def renewing(store: LogStore, hold: Hold, clock: Clock, ttl_ms: int) -> AsyncIterator[Keeper]:
    """Renew ``hold`` every third of its lifetime while the block runs (a long host call keeps its fire).

    A renewal that finds the record taken over stops renewing and sets ``lost``; the block itself runs to its
    end (the host call's result is still the truth to report), and its fenced write will then be refused.
    """
    keeper = Keeper(hold)

    async def keep() -> None:
        while True:
            await anyio.sleep(ttl_ms / 3000)
            try:
                renewed = await renew(store, keeper.hold, clock.now(), ttl_ms)
            except (
                StorageError
            ) as e:  # an outage: try again; if the record runs out meanwhile, the fire is lost
                log.warning("could not renew the fire record %s: %s", hold.key, e)
                continue
            if renewed is None:
                keeper.lost = True
                return
            keeper.hold = renewed

    failure: Exception | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(keep)
        try:
            yield keeper
        except Exception as e:  # raised below as itself, not inside the task group's ExceptionGroup
            failure = e
        finally:
            tg.cancel_scope.cancel()
    if failure is not None:
        raise failure
