"""The simulated host's holds: a port call stops at its start while its name is held, until released.

The holds live in the host's state (its file, when it has one), so ``loopd-es host hold|held|release`` in one
process controls the calls a running engine makes in another. The check is part of the call's own
transaction: a call that is not held costs nothing more. A held call takes a ticket and waits (on an event
when the state is in memory, polling the state file otherwise) until a release removes its ticket; then it
runs as if it had just been made. A held call that is cancelled gives its ticket back and never reaches the
host. See :mod:`loopd_es.host.holds` for the in-process hold point any host can have.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import anyio
import anyio.to_thread

from .holds import check_calls
from .sim_script import HeldCall, SimState, load_state

T = TypeVar("T")
_POLL_MIN_S = 0.002
_POLL_MAX_S = 0.05


class _Held:
    """What a gated transaction returns instead of the call's result while the call is held."""

    def __init__(self, ticket: int) -> None:
        self.ticket = ticket


class SimHolds:
    """Mixed into :class:`~loopd_es.host.simulated.SimulatedHost`: the hold point and its controls."""

    state_path: Path | None
    _url: str
    _hold_changed: anyio.Event | None = None

    async def _transact(self, fn: Callable[[SimState], T]) -> T:  # pragma: no cover - provided by the host
        raise NotImplementedError

    # -- the hold point -------------------------------------------------------------------------------

    async def _port(self, op: str, session_id: str | None, fn: Callable[[SimState], T]) -> T:
        """Run the port call ``op`` as one transaction, first waiting at its hold while it is held."""
        outcome = await self._transact(lambda state: self._gate(state, op, session_id, None, fn))
        if not isinstance(outcome, _Held):
            return outcome
        ticket = outcome.ticket
        try:
            await self._until_released(ticket)
        except BaseException:  # cancelled while held: give the ticket back; the call never happened
            with anyio.CancelScope(shield=True):
                await self._transact(lambda state: _drop(state, ticket))
            raise
        result = await self._transact(lambda state: self._gate(state, op, session_id, ticket, fn))
        assert not isinstance(result, _Held)  # the ticket was gone, so the gate ran the call
        return result

    def _gate(
        self,
        state: SimState,
        op: str,
        session_id: str | None,
        ticket: int | None,
        fn: Callable[[SimState], T],
    ) -> T | _Held:
        if ticket is None and op in state.holds:
            ticket = state.next_ticket
            state.next_ticket += 1
            state.held.append(HeldCall(ticket=ticket, op=op, session_id=session_id, pid=os.getpid()))
            self._holds_changed()
            return _Held(ticket)
        if ticket is not None and any(h.ticket == ticket for h in state.held):
            return _Held(ticket)
        return fn(state)

    async def _until_released(self, ticket: int) -> None:
        def waiting(state: SimState) -> bool:
            return any(h.ticket == ticket for h in state.held)

        await self._until(waiting)

    async def _until(self, still: Callable[[SimState], bool]) -> None:
        """Wait while ``still(state)``: on change events in memory, by reading the state file otherwise."""
        path = self.state_path
        if path is None:
            while True:
                changed = self._hold_event()
                if not await self._transact(still):
                    return
                await changed.wait()
        delay = _POLL_MIN_S
        while True:
            state = await anyio.to_thread.run_sync(load_state, path)  # a whole file: saves are atomic renames
            if state is None or not still(state):
                return
            await anyio.sleep(delay)
            delay = min(_POLL_MAX_S, delay * 2)

    def _hold_event(self) -> anyio.Event:
        if self._hold_changed is None:
            self._hold_changed = anyio.Event()
        return self._hold_changed

    def _holds_changed(self) -> None:
        if self._hold_changed is not None:
            self._hold_changed.set()
            self._hold_changed = None

    # -- controls (not part of the port) --------------------------------------------------------------

    async def hold(self, *calls: str) -> None:
        """From now on, the calls named in ``calls`` wait at their start until released (all processes)."""
        check_calls(calls, self._url)

        def run(state: SimState) -> None:
            state.holds.extend(c for c in calls if c not in state.holds)

        await self._transact(run)

    async def release(self, *calls: str) -> list[HeldCall]:
        """Let the held calls of ``calls`` (of every call when none is named) go on, and hold no more of them.

        Returns the calls that were waiting and now go on.
        """
        check_calls(calls, self._url)

        def run(state: SimState) -> list[HeldCall]:
            names = set(calls) if calls else {*state.holds, *(h.op for h in state.held)}
            state.holds = [c for c in state.holds if c not in names]
            freed = [h for h in state.held if h.op in names]
            state.held = [h for h in state.held if h.op not in names]
            self._holds_changed()
            return freed

        return await self._transact(run)

    async def held(self) -> tuple[list[str], list[HeldCall]]:
        """The calls held now, and the calls waiting at a hold (oldest first)."""
        return await self._transact(lambda state: (list(state.holds), list(state.held)))

    async def wait_held(self, call: str, *, count: int = 1) -> list[HeldCall]:
        """Return once ``count`` calls of ``call`` wait at its hold (bound it with a timeout): those calls."""
        check_calls((call,), self._url)

        def fewer(state: SimState) -> bool:
            return sum(h.op == call for h in state.held) < count

        await self._until(fewer)
        return [h for h in (await self.held())[1] if h.op == call]


def _drop(state: SimState, ticket: int) -> None:
    state.held = [h for h in state.held if h.ticket != ticket]
