"""The event catalogue: validation messages, round trips, upcasting, the evolution rules, generated docs."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopd_es.domain.evolve import fold, initial
from loopd_es.errors import InvalidEventError
from loopd_es.events.base import CATALOGUE
from loopd_es.events.catalogue import decode_data, decode_payload, json_schema, new_event, validate
from loopd_es.events.envelope import ENVELOPE_DECODER
from loopd_es.events.upcasting import register_upcaster, registered, upcast

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "goal_created_v1.ndjson"
REFERENCE_TYPES = [
    "goal.created",
    "goal.status_changed",
    "goal.progress",
    "goal.completed",
    "goal.blocked",
    "goal.cleared",
    "goal.completion_rejected",
    "goal.interactive_changed",
    "run.started",
    "run.completed",
    "run.failed",
    "run.recovered",
    "run.stuck",
]


def test_reference_type_strings_are_in_the_catalogue() -> None:
    assert set(REFERENCE_TYPES) <= set(CATALOGUE)
    for type_ in CATALOGUE:
        assert type_ == type_.lower() and "." in type_


def test_unknown_type_names_the_type_and_the_listing_command() -> None:
    with pytest.raises(InvalidEventError) as info:
        validate("goal.exploded", b"{}")
    assert "'goal.exploded'" in str(info.value) and "`loopd-es events`" in str(info.value)


def test_invalid_payload_carries_msgspec_path() -> None:
    with pytest.raises(InvalidEventError) as info:
        validate("goal.created", b'{"goal_id":"g","name":1,"objective":"o","owner_session_id":"s"}')
    assert str(info.value) == "invalid payload for goal.created: Expected `str`, got `int` - at `$.name`"
    with pytest.raises(InvalidEventError, match="Object missing required field `goal_id`"):
        validate("run.completed", b'{"run_id":"r"}')
    with pytest.raises(InvalidEventError, match="malformed|JSON"):
        validate("goal.cleared", b"{not json")


def _examples() -> list[Any]:
    from loopd_es.events import goal as g
    from loopd_es.events import identity as i
    from loopd_es.events import run as r

    return [
        g.GoalCreated(
            goal_id="g",
            name="n",
            objective="o",
            owner_session_id="s",
            config=g.GoalConfig(model="p/m", schedule=g.Schedule(every_ms=1000)),
        ),
        g.GoalStatusChanged(goal_id="g", from_status="active", to_status="paused"),
        r.RunStarted(goal_id="g", run_id="r", generation=1, prompt_message_id="msg_1", turn_count=1),
        i.IdentitySwitchApplied(goal_id="g", switch_id="s", target="model", to_model="p/n"),
        i.FallbackPrepared(goal_id="g", model="p/n", attempted=("p/m", "p/n")),
    ]


def test_round_trip_and_reference_keys() -> None:
    for payload in _examples():
        data = msgspec.json.encode(payload)
        validate(payload.event_type, data)
        assert decode_data(payload.event_type, data) == payload
    status = msgspec.json.decode(msgspec.json.encode(_examples()[1]))
    assert status == {"goal_id": "g", "from": "active", "to": "paused", "reason": None}


def test_new_event_carries_type_and_schema_version() -> None:
    created = new_event(_examples()[0], correlation_id="c")
    assert (created.type, created.schema_version, created.correlation_id) == ("goal.created", 3, "c")


def test_v1_fixture_log_still_reads_after_goal_created_moved_to_v2() -> None:
    envelopes = [ENVELOPE_DECODER.decode(line) for line in FIXTURE.read_bytes().splitlines()]
    assert envelopes[0].schema_version == 1 and CATALOGUE["goal.created"].schema_version == 3
    created = decode_payload(envelopes[0])
    assert created.config.model == "p/old" and created.config.max_turns == 7  # type: ignore[attr-defined]
    assert created.config.checks == ("make test",) and not created.config.workspace_write  # type: ignore[attr-defined]
    state = fold(envelopes, initial("legacy"))
    assert (state.name, state.status, state.config.agent, state.anomaly_count) == (
        "old goal",
        "paused",
        "build",
        0,
    )
    with pytest.raises(
        InvalidEventError, match=r"v1: Expected `str \| null`, got `int` - at `\$\.config\.model`"
    ):
        validate(
            "goal.created", b'{"goal_id":"g","name":"n","objective":"o","owner_session_id":"s","model":1}', 1
        )


def test_upcast_chain_and_errors() -> None:
    register_upcaster("test.thing", 1, lambda d: {"b": d["a"]})
    register_upcaster("test.thing", 2, lambda d: {**d, "c": d["b"] * 2})
    assert upcast("test.thing", 1, 3, {"a": 2}) == {"b": 2, "c": 4}
    with pytest.raises(InvalidEventError, match="no upcaster from test.thing v3"):
        upcast("test.thing", 3, 4, {})
    with pytest.raises(InvalidEventError, match="newer than this loopd-es knows"):
        upcast("goal.created", 4, 3, {})
    assert ("goal.created", 1) in registered()


def test_every_version_above_one_has_its_upcaster_chain() -> None:
    """Rule 4: a bumped type must still read every older version."""
    chains = set(registered())
    for type_, cls in CATALOGUE.items():
        for version in range(1, cls.schema_version):
            assert (type_, version) in chains, (
                f"{type_} v{cls.schema_version} lacks an upcaster from v{version}"
            )


@given(st.sampled_from(sorted(CATALOGUE)))
@settings(max_examples=60, deadline=None)
def test_every_new_field_has_a_default(type_: str) -> None:
    """Rule 1: every field beyond the ones a payload needs has a default, so old events decode.

    Required fields are checked against a frozen list (``tests/fixtures/required_fields.json``): adding a
    required field to an existing type fails here.
    """
    frozen = msgspec.json.decode((ROOT / "tests" / "fixtures" / "required_fields.json").read_bytes())
    required = sorted(f.encode_name for f in msgspec.structs.fields(CATALOGUE[type_]) if f.required)
    if type_ in frozen:
        assert required == sorted(frozen[type_]), f"required fields of {type_} changed"


def test_field_types_never_change() -> None:
    """Rule 2: the JSON Schema of every known type is frozen in a fixture with its version (``$version``,
    1 when absent); a change of type fails here. A type changes only with a version bump and its upcaster
    (rule 4), and the fixture is frozen again at the new version."""
    fixture = ROOT / "tests" / "fixtures" / "event_schema_types.json"
    current = msgspec.json.decode(msgspec.json.encode(_field_types()))
    frozen = msgspec.json.decode(fixture.read_bytes())
    for type_, fields in frozen.items():
        assert type_ in current, f"event type {type_} disappeared (tags are stable)"
        version = fields.pop("$version", 1)
        assert version == CATALOGUE[type_].schema_version, (
            f"{type_} is v{CATALOGUE[type_].schema_version}, frozen at v{version}: freeze its fields again"
        )
        for name, schema in fields.items():
            assert current[type_].get(name) == schema, f"{type_}.{name} changed type"


def _field_types() -> dict[str, dict[str, Any]]:
    schema = json_schema()
    defs = schema["$defs"]
    result = {}
    for type_, entry in schema["events"].items():
        ref = entry["schema"]["$ref"].rsplit("/", 1)[-1]
        result[type_] = {k: v for k, v in defs[ref]["properties"].items() if k != "default"}
    return result


def test_json_schema_covers_every_type() -> None:
    schema = json_schema()
    assert set(schema["events"]) == set(CATALOGUE)
    assert schema["events"]["goal.created"]["schema_version"] == 3


def test_docs_events_md_is_current(tmp_path: Path) -> None:
    """``docs/events.md`` is generated by ``tools/gen_events_doc.py``; regenerate it when this fails."""
    out = tmp_path / "events.md"
    subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_events_doc.py"), "--output", str(out)], check=True
    )
    committed = ROOT / "docs" / "events.md"
    assert committed.exists(), "run: python tools/gen_events_doc.py"
    if committed.read_text() != out.read_text():
        shutil.copy(out, tmp_path / "expected.md")
        pytest.fail("docs/events.md is stale: run `python tools/gen_events_doc.py`")


def test_no_event_carries_a_lease_expiry_or_fencing_token() -> None:
    """Coordination lives beside the log (``log/coord.py``): an expiry or a token renewed as events would be
    heartbeats. A run's timeout is its ``deadline`` (``run.started`` v3), decided once and never renewed."""
    coordination = {
        "lease_expires_at",
        "claim_expires_at",
        "expires_at",
        "expires_us",
        "lease_until",
        "token",
    }
    carried = {t: coordination & set(cls.__struct_fields__) for t, cls in CATALOGUE.items()}
    assert {t: f for t, f in carried.items() if f} == {}
