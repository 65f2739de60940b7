"""Log commands: ``append``, ``read``, ``streams``, ``verify``, ``export`` and ``import``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec

from ..errors import EXIT_OK, EXIT_STORAGE, StreamNotFoundError, UsageError
from ..events.envelope import ANY, ENVELOPE_ENCODER, Envelope, NewEvent
from ..log import POSTGRES_SCHEMES, LogStore, open_store
from ..log.base import parse_expected_version
from ..text_safe import term_line
from .main import store_url
from .options import non_negative_number, open_reader, positive_number

_JSON = msgspec.json.Decoder()


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the log commands to the ``loopd-es`` parser."""
    p = sub.add_parser(
        "append",
        help="append events to a stream",
        description="Append one event (--type/--data) or, without --type, a batch read as NDJSON from stdin "
        '(one {"type", "data", "event_id"?} per line; all to --stream, atomically). '
        "Prints the recorded envelopes as NDJSON.",
    )
    p.add_argument("--stream", required=True, help="the stream to append to, e.g. goal-42")
    p.add_argument("--type", help="the event type, e.g. goal.created (`loopd-es events` lists them)")
    data = p.add_mutually_exclusive_group()
    data.add_argument("--data", help="the payload as a JSON object")
    data.add_argument("--data-file", type=Path, help="read the payload from this JSON file")
    p.add_argument(
        "--expected-version",
        default=ANY,
        help="append only if the stream is at this version: a number, no_stream, exists or any (default)",
    )
    p.add_argument("--event-id", help="the event's UUID (the idempotency key; default: a fresh one)")
    p.add_argument("--causation-id", help="the id of the event that caused this one")
    p.add_argument("--correlation-id", help="the id shared by every event of one flow")
    p.set_defaults(handler=_append)

    p = sub.add_parser(
        "read",
        help="read events, as a table or as NDJSON envelopes",
        description="Read the log in position order (or one stream in version order), as a table or, with "
        "--json, one envelope per line exactly as stored.",
    )
    p.add_argument("--stream", help="read only this stream (--from is then a stream version)")
    p.add_argument(
        "--from",
        dest="start",
        type=positive_number,
        default=None,
        help="first position (or version); with --backwards the newest one shown (default: the first, or the last)",
    )
    p.add_argument("--limit", type=non_negative_number, default=None, help="at most this many events")
    p.add_argument(
        "--type", dest="types", action="append", metavar="TYPE", help="only events of this type (repeatable)"
    )
    p.add_argument("--backwards", action="store_true", help="newest first")
    p.add_argument(
        "--last", type=non_negative_number, default=None, metavar="N", help="only the last N events"
    )
    p.add_argument("--json", action="store_true", help="print envelopes as NDJSON")
    p.set_defaults(handler=_read, loopless=True)

    p = sub.add_parser(
        "streams",
        help="list the streams with their versions",
        description="List every stream in the log with its current version (its number of events).",
    )
    p.set_defaults(handler=_streams, loopless=True)

    p = sub.add_parser(
        "verify",
        help="check every invariant of the log",
        description="Checks gapless positions, contiguous versions, unique ids and decodable lines. "
        "Exit 0 only when clean, 4 otherwise.",
    )
    p.add_argument(
        "--repair",
        action="store_true",
        help="cut a torn tail or a crashed writer's unacknowledged write (never an acknowledged event)",
    )
    p.set_defaults(handler=_verify)

    p = sub.add_parser(
        "export",
        help="copy the whole log into a new, empty log (another backend too)",
        description="Copy every event, with its position, version, id and time, into the empty log at --to "
        "(any backend). A target that already holds events is refused.",
    )
    p.add_argument("--to", required=True, metavar="URL", help="the target, e.g. ndjson:backup.ndjson")
    p.set_defaults(handler=_export)

    p = sub.add_parser(
        "import",
        help="copy a whole log from URL into this (empty) log",
        description="Copy every event of the log at --from into this log (--store), which must be empty: "
        "export seen from the other side.",
    )
    p.add_argument("--from", dest="source", required=True, metavar="URL", help="the source log")
    p.set_defaults(handler=_import)


async def _open(args: argparse.Namespace, create: bool = True) -> LogStore:
    return await open_store(store_url(args), create=create)


# -- append -------------------------------------------------------------------------------------------


async def _append(args: argparse.Namespace) -> int:
    expected = parse_expected_version(args.expected_version)
    if args.type is None:
        if args.data is not None or args.data_file is not None or args.event_id is not None:
            raise UsageError(
                "--data, --data-file and --event-id need --type; for a batch, pipe NDJSON to stdin"
            )
        events = _batch_from_stdin(args)
    else:
        events = [_single_event(args)]
    store = await _open(args)
    try:
        recorded = await store.append(args.stream, events, expected)
    finally:
        await store.aclose()
    out = sys.stdout.buffer
    for env in recorded:
        out.write(ENVELOPE_ENCODER.encode(env) + b"\n")
    out.flush()
    return EXIT_OK


def _single_event(args: argparse.Namespace) -> NewEvent:
    if args.data_file is not None:
        try:
            raw = args.data_file.read_bytes()
        except OSError as e:
            raise UsageError(f"cannot read --data-file {args.data_file}: {e.strerror}") from e
        data = _parse_object(raw, f"--data-file {args.data_file}")
    elif args.data is not None:
        data = _parse_object(args.data.encode(), "--data")
    else:
        data = {}
    return _new_event(args.type, data, args.event_id, args.causation_id, args.correlation_id, "the event")


def _batch_from_stdin(args: argparse.Namespace) -> list[NewEvent]:
    if sys.stdin.isatty():
        raise UsageError(
            "no --type given and stdin is a terminal: pass --type T, or pipe NDJSON events to stdin"
        )
    events = []
    for number, line in enumerate(sys.stdin.buffer.read().splitlines(), start=1):
        if not line.strip():
            continue
        where = f"stdin line {number}"
        item = _parse_object(line, where)
        unknown = set(item) - {"type", "data", "event_id", "causation_id", "correlation_id"}
        if unknown:
            raise UsageError(
                f"{where}: unknown key(s) {sorted(unknown)}; use type, data, event_id, causation_id, correlation_id"
            )
        kind = item.get("type")
        if not isinstance(kind, str):
            raise UsageError(f'{where}: "type" must be a string, e.g. "goal.created"')
        data = item.get("data", {})
        if not isinstance(data, dict):
            raise UsageError(f'{where}: "data" must be a JSON object')
        events.append(
            _new_event(
                kind,
                data,
                _optional_str(item, "event_id", where),
                _optional_str(item, "causation_id", where) or args.causation_id,
                _optional_str(item, "correlation_id", where) or args.correlation_id,
                where,
            )
        )
    if not events:
        raise UsageError("stdin held no events; nothing was appended")
    return events


def _new_event(
    kind: str,
    data: dict[str, Any],
    event_id: str | None,
    causation: str | None,
    correlation: str | None,
    where: str,
) -> NewEvent:
    """Check the type and payload against the catalogue, then build the event at its current schema version."""
    from ..events import catalogue
    from ..events.base import CATALOGUE

    payload = msgspec.json.encode(data)
    try:
        catalogue.validate(kind, payload)
    except UsageError as e:
        raise type(e)(f"{where}: {e}") from None
    fields: dict[str, Any] = {
        "type": kind,
        "data": msgspec.Raw(payload),
        "causation_id": causation,
        "correlation_id": correlation,
        "schema_version": CATALOGUE[kind].schema_version,
    }
    if event_id is not None:
        fields["event_id"] = event_id
    return NewEvent(**fields)


def _parse_object(raw: bytes, where: str) -> dict[str, Any]:
    try:
        value = _JSON.decode(raw)
    except msgspec.DecodeError as e:
        raise UsageError(f"invalid JSON in {where}: {e}") from None
    if not isinstance(value, dict):
        raise UsageError(f'{where} must be a JSON object, e.g. {{"name": "x"}}')
    return value


def _optional_str(item: dict[str, Any], key: str, where: str) -> str | None:
    value = item.get(key)
    if value is not None and not isinstance(value, str):
        raise UsageError(f'{where}: "{key}" must be a string')
    return value


# -- read, streams ------------------------------------------------------------------------------------


async def _read(args: argparse.Namespace) -> int:
    if args.last is not None and args.start is not None:
        raise UsageError("--last and --from do not mix: --last N shows the N newest events")
    store = await open_reader(args)
    try:
        if args.stream is not None and await store.stream_version(args.stream) == 0:
            raise StreamNotFoundError(args.stream)
        batches = _selected(store, args)
        if args.json:
            out = sys.stdout.buffer
            async for batch in batches:
                out.write(ENVELOPE_ENCODER.encode_lines(batch))
            out.flush()
        else:
            first: list[Envelope] = await anext(
                batches, []
            )  # a store that refuses the read says so before any header
            print(f"{'POSITION':>8}  {'STREAM':<24} {'VER':>5}  {'TYPE':<28} {'RECORDED AT':<27} DATA")
            for env in first:
                print(_row(env))
            async for batch in batches:
                for env in batch:
                    print(_row(env))
        torn = getattr(store, "torn_tail", None)
        if torn is not None:
            print(
                f"loopd-es: note: the log ends in an incomplete write ({torn[1]} bytes at byte offset {torn[0]}), "
                "not shown; `loopd-es verify --repair` cuts it",
                file=sys.stderr,
            )
    finally:
        await store.aclose()
    return EXIT_OK


async def _selected(store: LogStore, args: argparse.Namespace) -> AsyncIterator[list[Envelope]]:
    """The batches ``read`` prints: forwards or backwards, filtered by type, bounded by --limit/--last."""
    types = None if args.types is None else frozenset(args.types)
    if not args.backwards and args.last is None:
        start = args.start or 1
        if args.stream is None:
            async for batch in store.read_filtered(from_position=start, limit=args.limit, types=args.types):
                yield batch
            return
        source = store.read_batches(stream=args.stream, from_version=start)
        async for batch in _kept(source, types, args.limit):
            yield batch
        return
    bound = (
        args.last
        if args.limit is None
        else min(args.limit, args.last if args.last is not None else args.limit)
    )
    newest = _kept(store.read_backwards(stream=args.stream, start=args.start), types, bound)
    if args.backwards:
        async for batch in newest:
            yield batch
        return
    window = [env async for batch in newest for env in batch]
    window.reverse()
    yield window


async def _kept(
    source: AsyncIterator[list[Envelope]], types: frozenset[str] | None, limit: int | None
) -> AsyncIterator[list[Envelope]]:
    remaining = -1 if limit is None else limit
    if remaining == 0:
        return
    async for batch in source:
        kept = batch if types is None else [env for env in batch if env.type in types]
        if remaining >= 0:
            kept = kept[:remaining]
            remaining -= len(kept)
        if kept:
            yield kept
        if remaining == 0:
            return


def _row(env: Envelope) -> str:
    data = bytes(env.data).decode("utf-8", "replace")
    if len(data) > 60:
        data = data[:57] + "..."
    return term_line(
        f"{env.position:>8}  {env.stream:<24} {env.version:>5}  {env.type:<28} {env.recorded_at:<27} {data}"
    )


async def _streams(args: argparse.Namespace) -> int:
    store = await open_reader(args)
    try:
        for name in await store.streams():
            print(f"{term_line(name)}\t{await store.stream_version(name)}")
    finally:
        await store.aclose()
    return EXIT_OK


# -- verify, export, import ---------------------------------------------------------------------------


async def _verify(args: argparse.Namespace) -> int:
    store = await _open(args, create=False)
    try:
        report = await store.verify(repair=args.repair)
    finally:
        await store.aclose()
    for message in report.repaired:
        print(term_line(message))
    for note in report.notes:
        print(f"note: {term_line(note)}")
    for problem in report.problems:  # may quote a damaged line's bytes
        print(f"problem: {term_line(problem)}")
    print(report.summary())
    return EXIT_OK if report.ok else EXIT_STORAGE


async def _export(args: argparse.Namespace) -> int:
    return await _copy(store_url(args), args.to, "export")


async def _import(args: argparse.Namespace) -> int:
    return await _copy(args.source, store_url(args), "import")


async def _copy(source_url: str, target_url: str, verb: str) -> int:
    """Copy the whole log at ``source_url`` into the new log at ``target_url``, all or nothing.

    The source is read as :meth:`~loopd_es.log.base.LogStore.read_for_copy` reads it, so damage in it is named
    there and never copied; a target this command made is removed again when the copy fails.
    """
    from ..log.files import NewFiles

    if verb == "export" and _is_bundle(target_url):  # import into one: the bundle says it is read-only
        raise UsageError(
            f"cannot export into {target_url}: a bundle is written from a goal with `loopd-es bundle GOAL -o "
            "FILE`; export into sqlite:, ndjson: or postgresql://"
        )
    source = await open_store(source_url, create=False)
    try:
        made = NewFiles(target_url)
        try:
            target = await open_store(target_url)
            try:
                if not target.read_only and (held := await target.head()):  # a bundle says it is read-only
                    raise UsageError(f"{target.url} is not empty ({held} events); {verb} only into a new log")
                count = await target.import_envelopes(source.read_for_copy())
            finally:
                await target.aclose()
        except BaseException:
            made.remove()
            raise
    finally:
        await source.aclose()
    print(f"copied {count} events from {source.url} to {target.url}")
    return EXIT_OK


def _is_bundle(url: str) -> bool:
    from ..log import parse_store_url

    return not url.strip().startswith(POSTGRES_SCHEMES) and parse_store_url(url)[0] == "bundle"
