"""Coordination beside the log: leases, memberships and claims as compare-and-set records, never as events.

Many engines share one log, and they must agree on who acts for what (one engine holds the log's lease; in a
shared group every goal has one claiming member). That agreement is *bookkeeping*, not history: renewing a
lease every few seconds as events would fill the goals' log with heartbeats. So each backend keeps a small
coordination table (SQLite and PostgreSQL: a table in the same database; NDJSON: a side file written under
the writers' lock; memory: a dict) of :class:`Claim` records keyed by name:

- :meth:`~loopd_es.log.base.LogStore.coord_swap` changes one record only if its ``token`` is still the one the
  caller read (compare-and-set; a missing record has token 0). Whoever takes a key over moves its token up by
  one, so a token is never reused for a key while its record exists; renewals keep the token.
- An append may carry :class:`Fence` s: it lands only if each fenced key still has that token, checked inside
  the same transaction (or under the same lock) as the append itself, and writes nothing for the fence. A holder
  that was paused past its lease and taken over therefore cannot land a write afterwards, whatever it believed.

The backends serialise coordination changes with appends (SQLite's write lock, PostgreSQL's row lock taken by
the append, the NDJSON writers' ``flock``), so a fence check and a takeover never interleave.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final, NamedTuple

import msgspec

from ..errors import ConflictError, UsageError

MAX_KEY: Final = 200
MAX_INFO: Final = 4096


class Claim(msgspec.Struct, frozen=True, kw_only=True):
    """One coordination record: who holds ``key``, under which fencing ``token``, until when.

    ``expires_us`` is a UTC instant in integer microseconds since the epoch (0: released). ``info`` is a short
    text the holder owns (a member's process id and renewal count, say); the store never reads it.
    """

    key: str
    holder: str
    token: int
    expires_us: int
    info: str = ""

    def live(self, now_us: int) -> bool:
        """Whether the record still holds at ``now_us`` (held by someone and not run out)."""
        return bool(self.holder) and now_us < self.expires_us


class Fence(NamedTuple):
    """An append's precondition: the coordination record ``key`` still has ``token``."""

    key: str
    token: int


class FenceLostError(ConflictError):
    """Raised when an append's fence no longer holds: another process took the key over; nothing was written."""

    def __init__(self, fence: Fence, actual: Claim | None) -> None:
        self.fence = fence
        self.actual = actual
        now = (
            f"token {actual.token} held by {actual.holder or 'nobody'}" if actual is not None else "no record"
        )
        super().__init__(
            f"the write was fenced on {fence.key!r} token {fence.token}, but the store has {now}; "
            "nothing was written (this process lost its claim and must stop acting on it)"
        )


def check_key(key: str) -> None:
    """:raises UsageError: for a key that is empty, too long or has control characters."""
    if not key or len(key) > MAX_KEY or any(ord(c) < 0x20 or c == "\x7f" for c in key):
        raise UsageError(f"coordination key {key!r} must be 1-{MAX_KEY} printable characters")


def check_claim(claim: Claim) -> None:
    """:raises UsageError: for a record that the store would refuse (bad key, negative token, long info)."""
    check_key(claim.key)
    if claim.token < 0 or claim.expires_us < 0:
        raise UsageError(f"coordination record {claim.key!r}: token and expiry must not be negative")
    if len(claim.info) > MAX_INFO:
        raise UsageError(f"coordination record {claim.key!r}: info is longer than {MAX_INFO} characters")


def check_swap(key: str, expected_token: int, new: Claim | None) -> None:
    """:raises UsageError: for a compare-and-set a store would refuse (see :func:`check_claim`)."""
    check_key(key)
    if expected_token < 0:
        raise UsageError(f"coordination record {key!r}: the expected token must not be negative")
    if new is not None:
        check_claim(new)
        if new.key != key:
            raise UsageError(f"coordination record {key!r}: the new record names another key, {new.key!r}")


def failed_fence(fences: Iterable[Fence], records: Mapping[str, Claim]) -> FenceLostError | None:
    """The error for the first fence ``records`` (key -> current record) no longer satisfies, else None."""
    for fence in fences:
        found = records.get(fence.key)
        if found is None or found.token != fence.token:
            return FenceLostError(fence, found)
    return None


def swap_in(records: dict[str, Claim], key: str, expected_token: int, new: Claim | None) -> Claim | None:
    """Compare-and-set on a plain dict (the memory and NDJSON backends): None when done, else the record found."""
    current = records.get(key)
    if (current.token if current is not None else 0) != expected_token:
        return current if current is not None else Claim(key=key, holder="", token=0, expires_us=0)
    if new is None:
        records.pop(key, None)
    else:
        records[key] = new
    return None


def with_prefix(records: Iterable[Claim], prefix: str) -> list[Claim]:
    """The records whose key starts with ``prefix``, ordered by key."""
    return sorted((c for c in records if c.key.startswith(prefix)), key=lambda c: c.key)


def fence_keys(fences: Sequence[Fence]) -> list[str]:
    """The distinct keys of ``fences`` in order (for a backend's look-up)."""
    return list(dict.fromkeys(f.key for f in fences))


CLAIMS_DECODER: Final = msgspec.json.Decoder(dict[str, Claim])
CLAIMS_ENCODER: Final = msgspec.json.Encoder()
