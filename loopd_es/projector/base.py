"""The projection contract: how a read model turns events into rows of the read database.

A projection owns some tables in the read database (prefix them with its name). The projector calls it on
a :class:`sqlite3.Connection` *inside a transaction the projector owns*: the projection's rows and its
checkpoint commit together or not at all, so a crash can neither apply an event twice nor skip one. A
projection therefore never commits, rolls back or opens transactions itself, and keeps no state outside
its tables: its tables must be a pure function of the events it was given, so that a rebuild from the log
comes out identical, row by row, to the incrementally built model.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from ..errors import StorageError, UsageError

if TYPE_CHECKING:
    from ..events.envelope import Envelope


@runtime_checkable
class Projection(Protocol):
    """A read model: a name, a version, its DDL, and how one event changes its rows."""

    name: str
    """Stable identifier, used for the checkpoint and on the command line (``projections rebuild NAME``)."""

    version: int
    """Bump it whenever the schema or the meaning of ``apply`` changes: the projector then drops the model
    (``reset``) and rebuilds it from the log on its next start."""

    def schema(self, conn: sqlite3.Connection) -> None:
        """Create the projection's tables and indexes (``CREATE TABLE IF NOT EXISTS`` ...).

        Called once when the projection is first registered, and after every ``reset``.
        """

    def apply(self, conn: sqlite3.Connection, envelope: Envelope) -> None:
        """Change the projection's rows to account for one event, which it has not seen before.

        Called in global position order, inside the projector's transaction and a savepoint of its own.
        Events the projection does not care about are simply ignored.

        :raises Exception: any exception (other than an environmental SQLite failure such as a full disk or
            a lock timeout) *parks* the event: its changes are rolled back, the event is stored with the
            error in the parked table, and the projection goes on with the next event.
        """

    def reset(self, conn: sqlite3.Connection) -> None:
        """Drop every table and index the projection owns (``DROP TABLE IF EXISTS`` ...)."""


class BatchProjection(Projection, Protocol):
    """A projection with a fast path for many events at once (optional; used by rebuilds and catch-up).

    ``apply_batch(conn, envelopes)`` must leave exactly the rows that calling ``apply`` on each envelope
    in order would. If it raises, the projector rolls it back and falls back to ``apply`` event by event,
    parking only the events that fail there.
    """

    def apply_batch(self, conn: sqlite3.Connection, envelopes: Sequence[Envelope]) -> None:
        """Apply ``envelopes`` (consecutive positions, in order) as ``apply`` would one by one."""


class ProjectionError(StorageError):
    """Raised when the read database cannot be used: it is corrupt, locked, built from another log, or
    ahead of the log it claims to follow."""


class UnknownProjectionError(UsageError):
    """Raised when a command names a projection that is not registered."""

    def __init__(self, name: str, known: Sequence[str]) -> None:
        self.name = name
        listed = ", ".join(known) or "none"
        super().__init__(
            f"unknown projection {name!r}; registered projections: {listed} (see `loopd-es projections status`)"
        )


def check_registry(projections: Sequence[Projection]) -> None:
    """Refuse registries the projector cannot keep apart: duplicate or malformed names, bad versions.

    :raises UsageError: naming the offending projection.
    """
    seen: set[str] = set()
    for projection in projections:
        name = getattr(projection, "name", None)
        if not isinstance(name, str) or not name or not name.replace("_", "").isalnum():
            raise UsageError(
                f"projection {projection!r} needs a name of letters, digits and '_', got {name!r}"
            )
        if name in seen:
            raise UsageError(f"two projections are named {name!r}; names must be unique")
        seen.add(name)
        version = getattr(projection, "version", None)
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise UsageError(f"projection {name!r} needs an integer version >= 1, got {version!r}")
