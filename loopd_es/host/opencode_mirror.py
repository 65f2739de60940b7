"""Each worker session's latest messages as OpenCode's ``/event`` stream tells them, so a turn's end is proven and
its last messages quoted without a transcript read on the path from the idle to the next prompt.

``/event`` has no resume id (docs/reference/opencode-host.md#s4): events sent while the stream is down are lost.
So a session's mirror starts from a transcript read made while the stream is connected (a *seed*), takes every
message and part event of that session after it, and is thrown away when the stream reconnects, when an event
cannot be read, and when OpenCode removes messages or parts (a revert, a compaction, a deleted session). A
session that has no mirror is read, as before.

The seed and the stream race: an event may arrive while the read is in flight, and the read may or may not show
it. Events carry whole messages and whole parts (only ``message.part.delta`` is a piece), so the mirror is the
read with every event that arrived since the read *started* applied again on top, in order: what the read
already showed is rewritten with the same or a newer state, never an older one for good.

Pure bookkeeping with no I/O: :class:`~loopd_es.host.opencode.OpenCodeHost` feeds it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import msgspec

from . import opencode_json as j

if TYPE_CHECKING:
    from .events import TranscriptMessage

KEEP: Final = 200
"""Messages kept per session: the engine's widest window (its confirmation window)."""
SESSIONS: Final = 512
"""Sessions mirrored at once; the one seeded longest ago goes first (a finished goal's worker is not read
again, and a session whose mirror went is simply read)."""

_DROPS: Final = frozenset({"message.removed", "message.part.removed", "session.compacted", "session.deleted"})
"""Events after which a session's mirror no longer matches its transcript: it is dropped (the next read seeds
it again)."""

Build = Callable[[j.MessageInfo, list[j.Part]], "TranscriptMessage"]


@dataclass
class _Session:
    """One session's messages and their parts, in the order OpenCode lists them: the order they were created
    in, which is the order the stream first tells of them (not their ids' order: a prompt's id is the
    client's)."""

    infos: dict[str, j.MessageInfo] = field(default_factory=dict)
    parts: dict[str, dict[str, j.Part]] = field(default_factory=dict)
    whole: bool = False
    """The mirror holds the whole session (its seed read returned fewer messages than it asked for)."""

    def is_new(self, info: j.MessageInfo) -> bool:
        """Whether a message the mirror does not hold was made after every message it holds (so it goes last,
        as OpenCode lists it); a mirror of the whole session holds every older one."""
        if self.whole or not self.infos:
            return True
        newest = next(reversed(self.infos.values())).time.created
        made = info.time.created
        return newest is None or (made is not None and made >= newest)

    def trim(self) -> None:
        if len(self.infos) > KEEP:
            for message_id in list(self.infos)[: len(self.infos) - KEEP]:
                del self.infos[message_id]
                self.parts.pop(message_id, None)
            self.whole = False


class StreamMirror:
    """The sessions' mirrors, the events that arrived during each seed read, and the stream's epoch."""

    def __init__(self, build: Build) -> None:
        self._build = build
        self._sessions: dict[str, _Session] = {}
        self._reads: dict[int, tuple[str, list[tuple[str, dict[str, Any]]]]] = {}
        self._next_read = 0
        self.epoch = 0
        self.connected = False

    def connect(self, connected: bool) -> None:
        """The stream (re)connected or dropped: what any mirror or read in flight rests on is gone."""
        self.connected = connected
        self.epoch += 1
        self._sessions.clear()
        self._reads.clear()

    def forget(self, session_id: str | None = None) -> None:
        """Drop one session's mirror (``None``: every session's), e.g. after an event that could not be read."""
        if session_id is None:
            self._sessions.clear()
        else:
            self._sessions.pop(session_id, None)

    def begin_read(self, session_id: str) -> int | None:
        """A transcript read of the session is starting: collect its events until :meth:`seed` (``None``: the
        stream is not connected, so the read cannot seed a mirror)."""
        if not self.connected:
            return None
        self._next_read += 1
        self._reads[self._next_read] = (session_id, [])
        return self._next_read

    def end_read(self, token: int | None) -> None:
        """A read that failed: stop collecting for it."""
        if token is not None:
            self._reads.pop(token, None)

    def seed(self, token: int | None, rows: list[j.MessageRow], limit: int) -> None:
        """The read ``token`` returned ``rows`` (the last ``limit`` messages): they, plus every event of the
        session since the read started, are its mirror now."""
        if token is None:
            return
        found = self._reads.pop(token, None)
        if found is None:
            return  # the stream reconnected during the read
        session_id, arrived = found
        mirror = _Session(whole=len(rows) < limit)
        for row in rows:
            mirror.infos[row.info.id] = row.info
            mirror.parts[row.info.id] = {
                part.id or str(i): part if part.type == "text" else msgspec.structs.replace(part, text=None)
                for i, part in enumerate(row.parts)
            }
        self._sessions.pop(session_id, None)
        self._sessions[session_id] = mirror
        while len(self._sessions) > SESSIONS:
            del self._sessions[next(iter(self._sessions))]
        try:
            for kind, props in arrived:
                self._apply(session_id, kind, props)
        except msgspec.ValidationError:
            self.forget(session_id)  # the stream's own handling of that event has already said so
            return
        if session_id in self._sessions:
            self._sessions[session_id].trim()

    def feed(self, kind: str, props: dict[str, Any], session_id: str) -> None:
        """One stream event of the session (any kind: the ones that say nothing of messages are ignored).

        :raises msgspec.ValidationError: when a message or part event is not what OpenCode sends (the
            session's mirror is dropped first).
        """
        if kind not in _KINDS:
            return
        for read_session, arrived in self._reads.values():
            if read_session == session_id:
                arrived.append((kind, props))
        try:
            self._apply(session_id, kind, props)
        except msgspec.ValidationError:
            self.forget(session_id)
            raise

    def _apply(self, session_id: str, kind: str, props: dict[str, Any]) -> None:
        mirror = self._sessions.get(session_id)
        if mirror is None:
            return
        if kind in _DROPS:
            self.forget(session_id)
        elif kind == "message.updated":
            info = j.convert(props, j.MessageProps).info
            if info.id in mirror.infos:
                mirror.infos[info.id] = info
            elif info.id and mirror.is_new(info):
                mirror.infos[info.id] = info
                mirror.parts[info.id] = {}
                mirror.trim()
            elif info.id:
                self.forget(session_id)  # made before a message the mirror holds, yet not in it: do not guess
        elif kind == "message.part.updated":
            part = j.convert(props, j.PartProps).part
            parts = mirror.parts.get(part.messageID or "")
            if parts is not None and part.id:  # OpenCode tells a message before its parts
                parts[part.id] = part if part.type == "text" else msgspec.structs.replace(part, text=None)
        elif kind == "message.part.delta":
            self._grow(mirror, props)

    @staticmethod
    def _grow(mirror: _Session, props: dict[str, Any]) -> None:
        """Streamed text appended to its part (the part's own update later carries the whole text again)."""
        message_id, part_id, delta = props.get("messageID"), props.get("partID"), props.get("delta")
        if props.get("field") != "text" or not isinstance(delta, str):
            return
        if not isinstance(message_id, str) or not isinstance(part_id, str):
            return
        part = mirror.parts.get(message_id, {}).get(part_id)
        if part is not None and part.type == "text":
            grown = msgspec.structs.replace(part, text=(part.text or "") + delta)
            mirror.parts[message_id][part_id] = grown

    def messages(self, session_id: str, limit: int) -> list[TranscriptMessage] | None:
        """The session's last ``limit`` messages, oldest first, as a read now would return them; ``None`` when
        the mirror cannot tell (no seed since the stream connected, or fewer messages kept than asked for)."""
        mirror = self._sessions.get(session_id)
        if mirror is None:
            return None
        ids = list(mirror.infos)
        if len(ids) < limit and not mirror.whole:
            return None
        build = self._build
        return [
            build(mirror.infos[message_id], list(mirror.parts.get(message_id, {}).values()))
            for message_id in ids[-limit:]
        ]


_KINDS: Final = frozenset({"message.updated", "message.part.updated", "message.part.delta", *_DROPS})
