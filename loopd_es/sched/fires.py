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

A scheduler reads a record only when it needs it (:class:`Records`): one it holds or released itself is known,
one that stands in the way is read again, so a tick costs no read per session that ever fired. Records are
never deleted (a deleted key's tokens would start again from 1, and a stalled holder's fence could pass).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
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


class _Names(msgspec.Struct, frozen=True):
    task_id: str
    slot: int
    attempt: int


_NOTHING: Final = _Names("", 0, 0)
_DECODE: Final = msgspec.json.Decoder(_Names)
_ENCODE: Final = msgspec.json.Encoder()


def in_flight(record: Claim | None) -> InFlight | None:
    """What a record says is being fired, for the deciders; ``None`` when nobody holds it.

    A held record that names no fire (taken to record lost fires, or one this version cannot read) is an
    :class:`InFlight` of task ``""``: it blocks the session and names no started fire, until it runs out.
    """
    if record is None or not record.holder:
        return None
    try:
        names = _DECODE.decode(record.info) if record.info else _NOTHING
    except msgspec.DecodeError:
        names = _NOTHING
    until = from_us(record.expires_us)
    return InFlight(task_id=names.task_id, slot=names.slot, attempt=names.attempt, until=until)


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


class Records:
    """One scheduler's fire records under ``prefix`` (one per session, or per goal), by scope id.

    ``on_change(scope)`` is called whenever what is known of a scope's record changes (the scheduler re-indexes
    when a started fire is to be looked at again).
    """

    def __init__(
        self,
        store: LogStore,
        prefix: str,
        *,
        holder: str,
        clock: Clock,
        ttl_ms: int,
        on_change: Callable[[str], None] = lambda _scope: None,
    ) -> None:
        self.store, self.prefix, self.holder, self.clock, self.ttl_ms = store, prefix, holder, clock, ttl_ms
        self.on_change = on_change
        self.known: dict[str, Claim] = {}

    def in_flight(self, scope: str) -> InFlight | None:
        """What the known record of ``scope`` says is being fired (see :func:`in_flight`)."""
        return in_flight(self.known.get(scope))

    def _learn(self, scope: str, record: Claim | None) -> None:
        if self.known.get(scope) == record:
            return
        if record is None:
            self.known.pop(scope, None)
        else:
            self.known[scope] = record
        self.on_change(scope)

    async def read(self, scope: str) -> Claim | None:
        """Read ``scope``'s record as the store has it now."""
        key = self.prefix + scope
        record = next((r for r in await self.store.coord_read(key) if r.key == key), None)
        self._learn(scope, record)
        return record

    async def free(self, scope: str, now: datetime) -> bool:
        """Whether nobody holds ``scope``'s record live at ``now``; a known record that says otherwise is read
        again (its holder may have released it since)."""
        return not busy(self.known.get(scope), now) or not busy(await self.read(scope), now)

    async def take(self, scope: str, names: tuple[str, int, int] | None = None) -> Hold | None:
        """Take ``scope``'s record over unless it is held live; ``None`` when it is, or changed meanwhile.

        A record this runner did not know, or knew with an older token (another runner took and released it
        since), is taken with the token its failed compare-and-set returned: a fresh runner's first fire is not
        put off until the record is looked at again.

        ``names`` is the ``(task, slot, attempt)`` about to be fired (none: taken to record lost fires). The
        record runs from now (the clock read here, not the tick's start: a tick fires sessions one after
        another).
        """
        now = self.clock.now()
        seen = self.known.get(scope)
        if seen is not None and seen.holder:  # held when last seen: renewed since? (renewals keep the token)
            seen = await self.read(scope)
        info = "" if names is None else _ENCODE.encode(_Names(*names)).decode()
        until = now + timedelta(milliseconds=self.ttl_ms)
        for _ in range(
            2
        ):  # a record unknown here, or released by another runner since: its swap tells the token
            if busy(seen, now):
                return None
            token = seen.token if seen is not None else 0
            hold = Hold(key=self.prefix + scope, holder=self.holder, token=token + 1, info=info, until=until)
            seen = await self.store.coord_swap(hold.key, token, hold.record(until))
            if seen is None:
                self._learn(scope, hold.record(until))
                return hold
            self._learn(scope, seen if seen.token else None)
        return None

    async def release(self, scope: str, hold: Hold) -> None:
        """Let go of ``hold`` (its token kept, so a later holder's is higher). Best effort: a record that was
        taken over stays as it is, and one that cannot be written now runs out by itself."""
        free = Claim(key=hold.key, holder="", token=hold.token, expires_us=0)
        try:
            found = await self.store.coord_swap(hold.key, hold.token, free)
        except StorageError as e:
            log.warning("could not release the fire record %s (it runs out by itself): %s", hold.key, e)
            self._learn(scope, None)  # not known any more: read again when needed
            return
        self._learn(scope, free if found is None else (found if found.token else None))

    async def renew(self, hold: Hold) -> Hold | None:
        """Extend ``hold`` from now; ``None`` when it was taken over (the fire is lost: its writes are refused).

        One that ran out and was not taken over yet is extended too: the fence, not the clock, says who lost.
        """
        until = self.clock.now() + timedelta(milliseconds=self.ttl_ms)
        found = await self.store.coord_swap(hold.key, hold.token, hold.record(until))
        return replace(hold, until=until) if found is None else None

    @asynccontextmanager
    async def renewing(self, keeper: Keeper) -> AsyncIterator[Keeper]:
        """Renew ``keeper.hold`` every third of its lifetime while the block runs (a long host call keeps its
        fire); ``keeper.hold`` is the latest.

        A renewal that finds the record taken over stops renewing; the block runs to its end (the host call's
        result is still the truth to report), and its fenced writes are refused. An exception of the block is
        raised as itself, not inside a task group's ``ExceptionGroup``.
        """
        hold = keeper.hold

        async def keep() -> None:
            while True:
                await anyio.sleep(self.ttl_ms / 3000)
                try:
                    renewed = await self.renew(keeper.hold)
                except Exception as e:  # an outage, or worse: the host call goes on; the record may run out
                    log.warning("could not renew the fire record %s: %s", hold.key, e)
                    continue
                if renewed is None:
                    return
                keeper.hold = renewed

        failure: Exception | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(keep)
            try:
                yield keeper
            except Exception as e:
                failure = e
            finally:
                tg.cancel_scope.cancel()
        if failure is not None:
            raise failure


@dataclass(slots=True)
class Keeper:
    """The hold a :meth:`Records.renewing` block keeps renewed (its latest version)."""

    hold: Hold
