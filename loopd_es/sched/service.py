"""``/loop`` commands against the log: read the session stream, decide, append at the version read.

A lost race (another instance appended first) re-reads and decides again, so two instances handling the same
message create one task (the decider finds it by ``origin_id``) and a pause is never overwritten: it is its
own event, and whatever else happened to the stream is folded before deciding.
"""

from __future__ import annotations

import random
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Final

import msgspec

from ..domain.loop import decide, texts
from ..domain.loop.grammar import Fail, Sub, parse
from ..domain.loop.model import SessionLoops, evolve
from ..errors import WrongExpectedVersionError
from ..events import loop as ev
from ..events.catalogue import decode_payload, new_event

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..events.base import Event
    from ..log.base import LogStore

_RETRIES: Final = 20
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
    raise WrongExpectedVersionError(ev.session_stream(session_id), "the version read", -1)


def find_loop_file(directory: Path, home: Path) -> decide.LoopFile:
    """The first ``loop.md`` with non-empty trimmed content: project ``.opencode/``, project root, user-level."""
    for path in (directory / ".opencode" / "loop.md", directory / "loop.md", home / ".opencode" / "loop.md"):
        content = read_loop_file(str(path))
        if content:
            return decide.LoopFile(path=str(path), content=content)
    return decide.LoopFile(path=None, content=None)


def read_loop_file(path: str) -> str | None:
    """``loop.md``'s text, ``None`` when missing, unreadable or blank."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError:
        return None
    return text if text.strip() else None


async def active_session(store: LogStore) -> str | None:
    """The session most recently activated (reading only the last event of ``loop-active``)."""
    version = await store.stream_version(ev.ACTIVE_STREAM)
    async for batch in store.read_batches(stream=ev.ACTIVE_STREAM, from_version=max(1, version)):
        for env in batch:
            e = decode_payload(env)
            return e.session_id if isinstance(e, ev.SessionActivated) else None
    return None


async def activate(store: LogStore, session_id: str, now: int, *, if_changed: bool = False) -> None:
    """Record that the user is in ``session_id`` (it becomes the session whose tasks fire)."""
    if if_changed and await active_session(store) == session_id:
        return
    await store.append(ev.ACTIVE_STREAM, [new_event(ev.SessionActivated(session_id=session_id, at=now))])


async def delete_session(store: LogStore, session_id: str, now: int) -> int:
    """Cancel every task of a deleted session (``session-deleted``), then record the deletion."""

    def cancel_all(s: SessionLoops) -> decide.Outcome:
        events: list[Event] = [
            ev.TaskCancelled(task_id=t.task_id, reason="session-deleted", at=now, by="host") for t in s.live()
        ]
        return decide.Outcome(events=events)

    out = await append_decided(store, session_id, cancel_all)
    await store.append(ev.ACTIVE_STREAM, [new_event(ev.SessionDeleted(session_id=session_id, at=now))])
    return len(out.events)


async def renew_lease(store: LogStore, owner: str, now: int, ttl_ms: int) -> None:
    """Extend ``owner``'s lease to ``now + ttl_ms``."""
    await store.append(
        ev.lease_stream(owner),
        [new_event(ev.OwnerLeaseRenewed(owner=owner, at=now, expires_at=now + ttl_ms))],
    )


async def handle(
    store: LogStore,
    args: str,
    *,
    session_id: str | None,
    now: int,
    cfg: decide.Config,
    origin_id: str | None = None,
    u: float | None = None,
    owner: str | None = None,
    durable: bool = True,
    directory: Path | None = None,
    home: Path | None = None,
) -> decide.Outcome:
    """Run one ``/loop ARGS`` command for ``session_id`` (reference §2.2): the message and the model's prompt."""
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
    now: int,
    cfg: decide.Config,
    origin_id: str | None,
    u: float | None,
    owner: str | None,
    durable: bool,
    directory: Path | None,
    home: Path | None,
) -> decide.Outcome:
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
    await activate(store, session_id, now, if_changed=True)  # every /loop command marks its session active
    if isinstance(parsed, Sub):
        sub = parsed
        return await append_decided(
            store,
            session_id,
            lambda s: decide.manage(s, _action(sub), sub.task_id, now=now, u=draw, cfg=cfg),
        )
    where = directory or Path.cwd()
    loop_file = find_loop_file(where, home or Path.home())
    origin = origin_id or str(uuid.uuid4())
    total = sum(len(s.live()) for s in await read_all_sessions(store))
    other = total - len((await read_session(store, session_id)).live())
    spec = parsed
    return await append_decided(
        store,
        session_id,
        lambda s: decide.create(
            s,
            spec,
            origin_id=origin,
            now=now,
            u=draw,
            total_live=other + len(s.live()),
            cfg=cfg,
            owner=owner,
            durable=durable,
            directory=str(where),
            loop_file=loop_file,
        ),  # fmt: skip
        correlation_id=str(uuid.uuid5(_NS, origin)),
    )


def _action(sub: Sub) -> str:
    return "cancel" if sub.action == "stop" else sub.action
