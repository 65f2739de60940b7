"""Properties of the log: envelopes survive encoding, and any sequence of appends leaves a log equal to a model.

The model is a list of recorded events and a per-stream version; it says, for each append, whether it lands,
returns the original envelopes of a retry, or is refused (and with which error).
"""

from __future__ import annotations

import tempfile
import warnings
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopd_es.clock import now_rfc3339, parse_rfc3339
from loopd_es.errors import DuplicateEventIdError, WrongExpectedVersionError
from loopd_es.events.envelope import (
    ANY,
    ENVELOPE_DECODER,
    ENVELOPE_ENCODER,
    EXISTS,
    NO_STREAM,
    Envelope,
    ExpectedVersion,
    Foldable,
    NewEvent,
)
from loopd_es.log import open_store

# Hypothesis imports its patch writer (libcst -> mypy_extensions) only when a test fails; under
# filterwarnings=error that import's DeprecationWarning turns a readable failure into an INTERNALERROR.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    try:
        import hypothesis.extra._patching  # noqa: F401
    except ImportError:  # pragma: no cover - hypothesis without its optional patching support
        pass

KEYS = [
    "position",
    "stream",
    "version",
    "event_id",
    "type",
    "schema_version",
    "recorded_at",
    "causation_id",
    "correlation_id",
    "data",
]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)  # fmt: skip
json_objects = st.dictionaries(st.text(max_size=10), json_values, max_size=5)
timestamps = st.datetimes(
    min_value=datetime(1970, 1, 1), max_value=datetime(9999, 12, 31), timezones=st.just(UTC)
)
ids = st.uuids().map(str)


def rfc3339(dt: datetime) -> str:
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


envelopes = st.builds(
    Envelope,
    position=st.integers(1, 2**62),
    stream=st.text(min_size=1, max_size=30),
    version=st.integers(1, 2**62),
    event_id=ids,
    type=st.from_regex(r"\A[a-z]{1,8}\.[a-z_]{1,12}\Z"),
    schema_version=st.integers(1, 100),
    recorded_at=timestamps.map(rfc3339),
    causation_id=st.none() | ids,
    correlation_id=st.none() | ids,
    data=json_objects.map(lambda d: msgspec.Raw(msgspec.json.encode(d))),
)


@given(envelopes)
def test_envelope_encode_decode_round_trip(env: Envelope) -> None:
    line = ENVELOPE_ENCODER.encode(env)
    assert b"\n" not in line
    decoded = ENVELOPE_DECODER.decode(line)
    assert decoded == env
    assert list(msgspec.json.decode(line)) == KEYS
    assert ENVELOPE_ENCODER.encode(decoded) == line
    assert decoded.data_dict() == msgspec.json.decode(bytes(env.data))


@given(json_objects, st.sampled_from(["dict", "raw", "bytes"]))
def test_new_event_data_bytes_round_trip(data: dict[str, Any], form: str) -> None:
    encoded = msgspec.json.encode(data)
    payload: Any = {"dict": data, "raw": msgspec.Raw(encoded), "bytes": encoded}[form]
    assert msgspec.json.decode(NewEvent(type="t.x", data=payload).data_bytes()) == data


@given(timestamps)
def test_timestamps_round_trip(dt: datetime) -> None:
    text = rfc3339(dt)
    assert parse_rfc3339(text) == dt


def test_now_is_rfc3339_utc_with_microseconds() -> None:
    text = now_rfc3339()
    assert len(text) == len("2026-12-02T12:56:47.123456Z") and text.endswith("Z")
    assert abs((parse_rfc3339(text) - datetime.now(UTC)).total_seconds()) < 5


# -- the log against a model ----------------------------------------------------------------------


@dataclass
class Model:
    events: list[tuple[str, NewEvent]] = field(default_factory=list)  # (stream, event) in position order
    batches: list[list[NewEvent]] = field(default_factory=list)

    def version(self, stream: str) -> int:
        return sum(1 for s, _ in self.events if s == stream)

    def find(self, event_id: str) -> tuple[int, str, NewEvent] | None:
        for i, (s, e) in enumerate(self.events):
            if e.event_id == event_id:
                return i, s, e
        return None


def _same(a: NewEvent, b: NewEvent) -> bool:
    return (a.type, a.data, a.schema_version, a.causation_id, a.correlation_id) == (
        b.type,
        b.data,
        b.schema_version,
        b.causation_id,
        b.correlation_id,
    )


@st.composite
def operations(draw: st.DrawFn) -> list[tuple[str, str, Any, ExpectedVersion]]:
    """(kind, stream, payload, expected) with kind "new", "retry" (batch index) or "tamper" (batch index)."""
    ops: list[tuple[str, str, Any, ExpectedVersion]] = []
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["new", "new", "new", "retry", "tamper"]))
        stream = draw(st.sampled_from(["a", "b", "c"]))
        expected: ExpectedVersion = draw(st.sampled_from([ANY, NO_STREAM, EXISTS, 0, 1, 2, 3, 4]))
        payload: Any = draw(st.integers(1, 3)) if kind == "new" else draw(st.integers(0, 20))
        ops.append((kind, stream, payload, expected))
    return ops


def _fold_view(e: Foldable) -> tuple[int, str, int, str, int, str, bytes]:
    return (e.position, e.stream, e.version, e.type, e.schema_version, e.recorded_at, bytes(e.data))


async def _check_against_model(url: str, ops: list[tuple[str, str, Any, ExpectedVersion]]) -> None:
    model = Model()
    recorded_by_id: dict[str, Envelope] = {}
    async with await open_store(url) as store:
        for n, (kind, stream, payload, expected) in enumerate(ops):
            if kind == "new":
                batch = [NewEvent(type="prop.happened", data={"op": n, "k": k}) for k in range(payload)]
            elif not model.batches:
                continue
            else:
                batch = model.batches[payload % len(model.batches)]
                if kind == "tamper":
                    batch = [msgspec.structs.replace(batch[0], data={"tampered": n}), *batch[1:]]
            # what the model says must happen
            found = [model.find(e.event_id) for e in batch]
            if all(f is not None for f in found):
                identical = all(
                    f is not None and f[1] == stream and _same(f[2], e)
                    for f, e in zip(found, batch, strict=True)
                )
                outcome = "retry" if identical else "duplicate"
            elif any(f is not None for f in found):
                outcome = "duplicate"
            else:
                actual = model.version(stream)
                ok = (
                    expected == ANY
                    or (expected == NO_STREAM and actual == 0)
                    or (expected == EXISTS and actual > 0)
                    or expected == actual
                )
                outcome = "land" if ok else "conflict"
            head_before = len(model.events)
            if outcome in ("land", "retry"):
                got = await store.append(stream, batch, expected)
                assert [e.event_id for e in got] == [e.event_id for e in batch]
                if outcome == "retry":
                    assert got == [recorded_by_id[e.event_id] for e in batch]
                else:
                    base = model.version(stream)
                    assert [e.position for e in got] == list(
                        range(head_before + 1, head_before + len(batch) + 1)
                    )
                    assert [e.version for e in got] == list(range(base + 1, base + len(batch) + 1))
                    model.events += [(stream, e) for e in batch]
                    model.batches.append(batch)
                    recorded_by_id.update({e.event_id: e for e in got})
            elif outcome == "duplicate":
                with pytest.raises(DuplicateEventIdError):
                    await store.append(stream, batch, expected)
            else:
                with pytest.raises(WrongExpectedVersionError) as info:
                    await store.append(stream, batch, expected)
                assert (info.value.stream, info.value.expected, info.value.actual) == (
                    stream,
                    expected,
                    model.version(stream),
                )
            assert await store.head() == len(model.events)
        log = [e async for e in store.read_all()]
        assert [(e.position, e.stream, e.event_id) for e in log] == [
            (i + 1, s, e.event_id) for i, (s, e) in enumerate(model.events)
        ]
        assert [e.data_dict() for e in log] == [e.data for _, e in model.events]
        assert log == [recorded_by_id[e.event_id] for _, e in model.events]
        for s in ("a", "b", "c"):
            assert await store.stream_version(s) == model.version(s)
            assert [e.version for e in log if e.stream == s] == list(range(1, model.version(s) + 1))
        assert await store.streams() == sorted({s for s, _ in model.events})
        # what a fold reads is the same events, field for field, however the backend shapes it
        assert [_fold_view(e) for b in [b async for b in store.read_recorded()] for e in b] == [
            _fold_view(e) for e in log
        ]
        for s in ("a", "b", "c"):
            tail = [
                _fold_view(e)
                for b in [b async for b in store.read_recorded(stream=s, from_version=2)]
                for e in b
            ]
            assert tail == [_fold_view(e) for e in log if e.stream == s and e.version >= 2]
    async with await open_store(url) as again:  # and it all survives a reopen
        assert [e async for e in again.read_all()] == log


@pytest.mark.parametrize("backend", ["ndjson", "sqlite"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=operations())
def test_random_appends_match_the_model(
    backend: str, ops: list[tuple[str, str, Any, ExpectedVersion]]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        name = "log.ndjson?durability=none" if backend == "ndjson" else "log.db?synchronous=OFF"
        anyio.run(_check_against_model, f"{backend}:{Path(tmp) / name}", ops)
