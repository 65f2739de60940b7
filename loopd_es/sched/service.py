"""``/loop`` commands against the log: read the session stream, decide, append at the version read.

A lost race (another instance appended first) re-reads and decides again, so two instances handling the same
message create one task (the decider finds it by ``origin_id``) and a pause is never overwritten: it is its
own event, and whatever else happened to the stream is folded before deciding.
"""

from __future__ import annotations

import random
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Final

import msgspec

from ..clock import from_us, to_us
from ..domain.loop import decide, jsclass, texts
from ..domain.loop.grammar import Adaptive, Fail, Fixed, Maintenance, Sub, parse
from ..domain.loop.model import SessionLoops, evolve
from ..errors import ConflictError, StorageError, UsageError, WrongExpectedVersionError
from ..events import loop as ev
from ..events.catalogue import decode_payload, new_event
from ..log.base import StreamWrite, check_stream_name
from ..log.coord import Claim
from ..log.coord_hold import coord_hold

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..log.base import LogStore

_RETRIES: Final = 20
CAP_KEY: Final = "loops/task-cap"
"""The coordination record held while live tasks are counted and a creation lands (the project-wide cap)."""
_CAP_HOLD_US: Final = 10_000_000
_CAP_WAIT_S: Final = 20.0
_CAP_BUSY: Final = "another process has been creating a /loop task for a while; run the command again"
_NS: Final = uuid.UUID("6f1f3c55-3b2e-4f83-9d2a-0c4a58d1e0a1")


async def read_session(store: LogStore, session_id: str) -> SessionLoops:
    """One session's tasks, folded from its stream (empty when it has none)."""
    s = SessionLoops(session_id=session_id)
    async for batch in store.read_batches(stream=ev.session_stream(session_id)):
        for env in batch:
            evolve(s, decode_payload(env))
            s.version = env.version
    return s


async def read_all_sessions(store: LogStore) -> list[SessionLoops]:
    """Every session that has loop tasks (used for the project-wide 50-task cap and listings)."""
    found = [n for n in await store.streams() if n.startswith(ev.SESSION_PREFIX)]
    return [await read_session(store, n[len(ev.SESSION_PREFIX) :]) for n in found]


async def append_decided(
    store: LogStore,
    session_id: str,
    decide_fn: Callable[[SessionLoops], decide.Outcome],
    *,
    correlation_id: str | None = None,
) -> decide.Outcome:
    """Decide on the freshest state and append at its version; on a lost race, re-read and decide again."""
    correlation_id = correlation_id or str(uuid.uuid4())  # one id for the events of one command
    for _ in range(_RETRIES):
        s = await read_session(store, session_id)
        out = decide_fn(s)
        if not out.events:
            return out
        try:
            await store.append(
                ev.session_stream(session_id),
                [new_event(e, correlation_id=correlation_id) for e in out.events],
                expected_version=s.version,
            )
        except WrongExpectedVersionError:
            continue
        return out
    raise _gave_up(ev.session_stream(session_id))


def _gave_up(stream: str) -> ConflictError:
    return ConflictError(f"stream {stream!r} kept changing during {_RETRIES} attempts; run the command again")


def find_loop_file(directory: Path, home: Path) -> decide.LoopFile:
    """The first ``loop.md`` with non-empty trimmed content: project ``.opencode/``, project root, user-level."""
    for path in (directory / ".opencode" / "loop.md", directory / "loop.md", home / ".opencode" / "loop.md"):
        content = read_loop_file(str(path))
        if content:
            return decide.LoopFile(path=str(path), content=content)
    return decide.LoopFile(path=None, content=None)


def read_loop_file(path: str) -> str | None:
    """``loop.md``'s text, ``None`` when missing, unreadable or blank (a BOM alone is blank, as in the reference)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError:
        return None
    return text if jsclass.trim(text) else None


async def active_session(store: LogStore) -> str | None:
    """The session most recently activated (reading only the last event of ``loop-active``)."""
    version = await store.stream_version(ev.ACTIVE_STREAM)
    async for batch in store.read_batches(stream=ev.ACTIVE_STREAM, from_version=max(1, version)):
        for env in batch:
            e = decode_payload(env)
            return e.session_id if isinstance(e, ev.SessionActivated) else None
    return None


def check_session_id(session_id: str) -> None:
    """:raises UsageError: when ``session_id`` cannot name a session's stream (printable, not too long)."""
    stream = ev.session_stream(session_id)
    try:
        check_stream_name(stream)
    except UsageError:
        most = 200 - len(stream) + len(session_id)
        raise UsageError(
            f"loop: session id {session_id!r} cannot name a session: use 1 to {most} printable characters"
        ) from None


async def activate(store: LogStore, session_id: str, now: datetime, *, if_changed: bool = False) -> None:
    """Record that the user is in ``session_id`` (it becomes the session whose tasks fire).

    :raises UsageError: when ``session_id`` cannot name a session's stream (nothing is recorded then: an
        activation of a session that can hold no task would only stop the active one's tasks firing).
    """
    check_session_id(session_id)
    if if_changed and await active_session(store) == session_id:
        return
    await store.append(ev.ACTIVE_STREAM, [new_event(ev.SessionActivated(session_id=session_id, at=now))])


async def delete_session(store: LogStore, session_id: str, now: datetime) -> int:
    """Cancel every task of a deleted session (``session-deleted``) and record the deletion, in one append."""
    deleted = new_event(ev.SessionDeleted(session_id=session_id, at=now))
    for _ in range(_RETRIES):
        s = await read_session(store, session_id)
        cancels = [
            new_event(ev.TaskCancelled(task_id=t.task_id, reason="session-deleted", at=now, by="host"))
            for t in s.live()
        ]
        writes = [StreamWrite(ev.session_stream(session_id), cancels, s.version)] if cancels else []
        try:
            await store.append_many([*writes, StreamWrite(ev.ACTIVE_STREAM, [deleted])])
        except WrongExpectedVersionError:
            continue
        return len(cancels)
    raise _gave_up(ev.session_stream(session_id))


LOOP_PREFIX: Final = "loop/"
"""Every /loop coordination record: owners' leases here, fire records in :mod:`.fires`."""
OWNER_PREFIX: Final = LOOP_PREFIX + "owner/"
"""Coordination keys of /loop owners' leases (beside the log, never events: renewals are no history)."""


async def renew_lease(store: LogStore, owner: str, now: datetime, ttl_ms: int) -> None:
    """Extend ``owner``'s lease to ``now + ttl_ms``; an ephemeral task lives while it holds."""
    key = OWNER_PREFIX + owner
    for _ in range(20):
        found = [c for c in await store.coord_read(key) if c.key == key]
        token = found[0].token if found else 0
        record = Claim(key=key, holder=owner, token=max(token, 1), expires_us=to_us(now) + ttl_ms * 1000)
        if await store.coord_swap(key, token, record) is None:
            return
    raise StorageError(f"the lease of /loop owner {owner!r} kept changing under this renewal; try again")


async def release_lease(store: LogStore, owner: str) -> None:
    """Drop ``owner``'s lease (a clean stop): its ephemeral tasks end at the next sweep."""
    key = OWNER_PREFIX + owner
    for record in await store.coord_read(key):
        if record.key == key:
            await store.coord_swap(key, record.token, None)


async def sweep_owner_leases(store: LogStore, now: datetime, *, older_than_ms: int = 3_600_000) -> int:
    """Delete owners' leases that ran out over ``older_than_ms`` ago (an absent lease reads as run out, so
    nothing changes but the record count); returns how many went."""
    gone, before = 0, now - timedelta(milliseconds=older_than_ms)
    for record in await store.coord_read(OWNER_PREFIX):
        if from_us(record.expires_us) < before:
            gone += await store.coord_swap(record.key, record.token, None) is None
    return gone


def lease_expiries(records: list[Claim]) -> dict[str, datetime]:
    """Owner -> lease expiry, from coordination records (others than owners' leases are ignored)."""
    return {
        c.key[len(OWNER_PREFIX) :]: from_us(c.expires_us) for c in records if c.key.startswith(OWNER_PREFIX)
    }


async def handle(
    store: LogStore,
    args: str,
    *,
    session_id: str | None,
    now: datetime,
    cfg: decide.Config,
    origin_id: str | None = None,
    u: float | None = None,
    owner: str | None = None,
    durable: bool = True,
    directory: Path | None = None,
    home: Path | None = None,
) -> decide.Outcome:
    """Run one ``/loop ARGS`` command for ``session_id`` (docs/reference/loop-plugin.md#s2-2): the message and
    the model's prompt."""
    out = await _handle(store, args, session_id=session_id, now=now, cfg=cfg, origin_id=origin_id, u=u, owner=owner,
                        durable=durable, directory=directory, home=home)  # fmt: skip
    if out.model_prompt is not None:
        return out
    if out.error is not None or out.message.startswith("❌"):
        return msgspec.structs.replace(out, model_prompt=texts.failure_prompt(out.message))
    return msgspec.structs.replace(out, model_prompt=texts.presentation_prompt(out.message))


async def _handle(
    store: LogStore,
    args: str,
    *,
    session_id: str | None,
    now: datetime,
    cfg: decide.Config,
    origin_id: str | None,
    u: float | None,
    owner: str | None,
    durable: bool,
    directory: Path | None,
    home: Path | None,
) -> decide.Outcome:
    if session_id:  # like the reference, before parsing: a failing or help command activates its session too
        await activate(store, session_id, now, if_changed=True)
    parsed = parse(args, has_session=bool(session_id))
    if isinstance(parsed, Fail):
        return decide.Outcome(message=parsed.message, error="usage")
    if isinstance(parsed, Sub) and parsed.action == "help":
        return decide.Outcome(message=texts.HELP)
    if not session_id:  # subcommands before the session check operate on an empty scope
        empty = SessionLoops(session_id="")
        if isinstance(parsed, Sub):
            return decide.manage(empty, _action(parsed), parsed.task_id, now=now, u=0.0, cfg=cfg)
        return decide.Outcome(message=texts.NO_SESSION, error="usage")
    draw = random.random() if u is None else u
    if isinstance(parsed, Sub):
        sub = parsed
        return await append_decided(
            store,
            session_id,
            lambda s: decide.manage(s, _action(sub), sub.task_id, now=now, u=draw, cfg=cfg),
        )
    where = directory or Path.cwd()
    return await create_task(
        store, session_id, parsed, origin_id=origin_id or str(uuid.uuid4()), now=now, u=draw, cfg=cfg, owner=owner,
        durable=durable, directory=str(where), loop_file=find_loop_file(where, home or Path.home()),
    )  # fmt: skip


async def create_task(
    store: LogStore,
    session_id: str,
    spec: Fixed | Adaptive | Maintenance,
    *,
    origin_id: str,
    now: datetime,
    u: float,
    cfg: decide.Config,
    owner: str | None = None,
    durable: bool = True,
    directory: str = "",
    via: ev.Via = "slash",
    loop_file: decide.LoopFile | None = None,
) -> decide.Outcome:
    """Create a task unless the project already has ``cfg.max_tasks`` live ones, exactly, even under races.

    The live tasks are counted holding the ``loops/task-cap`` coordination record (:mod:`~..log.coord_hold`),
    and the creation is appended fenced on it, so a creation in another session or process counts after this
    one has landed. Cancellations only lower the count, so they need not hold it. A race inside the session
    (a pause, the same message handled twice) re-reads and decides again.
    """
    corr = str(uuid.uuid5(_NS, origin_id))
    async with coord_hold(store, CAP_KEY, hold_us=_CAP_HOLD_US, wait_s=_CAP_WAIT_S, busy=_CAP_BUSY) as cap:
        for _ in range(_RETRIES):
            sessions = await read_all_sessions(store)
            s = next((x for x in sessions if x.session_id == session_id), SessionLoops(session_id=session_id))
            out = decide.create(
                s, spec, origin_id=origin_id, now=now, u=u, total_live=sum(len(x.live()) for x in sessions),
                cfg=cfg, owner=owner, durable=durable, directory=directory, via=via, loop_file=loop_file,
            )  # fmt: skip
            if not out.events or out.task_id is None:
                return out
            events = [new_event(e, correlation_id=corr) for e in out.events]
            try:
                await store.append(ev.session_stream(session_id), events, s.version, fences=(cap,))
            except WrongExpectedVersionError:
                continue
            return out
    raise _gave_up(ev.session_stream(session_id))


def _action(sub: Sub) -> str:
    return "cancel" if sub.action == "stop" else sub.action
