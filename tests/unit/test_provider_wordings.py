"""Every provider's own words for a rate limit or a quota, as OpenCode reports them (one fixture per provider).

Each fixture in ``tests/fixtures/provider_errors/`` holds the provider's documented errors in the shape of an
OpenCode ``session.error`` (an ``APIError`` with the provider's response body as a string) and the texts its
retry status shows while OpenCode retries; the classifier must tell each as the fixture says.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from loopd_es.domain.provider_limit import classify, describe_error
from loopd_es.host.opencode_events import normalise_error

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "provider_errors"
PROVIDERS = ("openai", "anthropic", "google", "openrouter", "azure", "bedrock", "opencode")


def _load(provider: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((FIXTURES / f"{provider}.json").read_text())
    return loaded


def _cases(key: str) -> list[Any]:
    return [
        pytest.param(case, id=f"{provider}: {case.get('name') or case['message'][:40]}")
        for provider in PROVIDERS
        for case in _load(provider)[key]
    ]


def test_there_is_one_fixture_per_provider_each_with_limits_and_non_limits() -> None:
    assert sorted(p.stem for p in FIXTURES.glob("*.json")) == sorted(PROVIDERS)
    for provider in PROVIDERS:
        kinds = {case["kind"] for case in _load(provider)["errors"]}
        assert "rate-limit" in kinds or "quota" in kinds, provider
        assert _load(provider)["retry_status"], provider


@pytest.mark.parametrize("case", _cases("errors"))
def test_a_session_error_is_classified_as_the_provider_means_it(case: dict[str, Any]) -> None:
    error = normalise_error(case["error"])
    observed = classify(error, "session-error", NOW, "p/m")
    assert (observed.kind if observed else None) == case["kind"], error
    message = (case["error"].get("data") or case["error"])["message"]
    assert describe_error(error) == message if message else "responseHeaders" not in describe_error(error)


@pytest.mark.parametrize("case", _cases("retry_status"))
def test_a_retry_status_text_is_recognised_by_its_words_alone(case: dict[str, Any]) -> None:
    observed = classify({"message": case["message"]}, "session-error", NOW)
    assert observed is not None and observed.kind == case["kind"]
    retrying = classify({"message": case["message"]}, "session-error", NOW, retrying=True)
    assert retrying is not None and retrying.kind == case["kind"]


def test_any_retry_status_is_a_limit_when_retrying_but_words_alone_are_not() -> None:
    assert classify({"message": "Internal server error"}, "session-error", NOW) is None
    observed = classify({"message": "Internal server error"}, "session-error", NOW, retrying=True)
    assert observed is not None and observed.kind == "rate-limit"


@pytest.mark.parametrize(
    "text",
    [
        "network rate limit",
        "authentication quota exceeded",
        "maximum context length exceeded",
        "cost budget limit",
        "maxTurns reached",
        "paused",
        "quota information unknown",
        "rate limit information unknown",
        "ECONNRESET",
        "request timeout",
        "Invalid API key",
    ],
)
def test_the_reference_non_limits_stay_non_limits(text: str) -> None:
    assert classify(text, "session-error", NOW) is None


def test_describe_error_keeps_the_message_as_the_reference_does() -> None:
    assert describe_error({"message": "error 5"}) == "error 5"
    assert describe_error("boom") == "boom"
    assert describe_error({"name": "APIError", "data": {"message": "Overloaded"}}) == "Overloaded"
    shown = describe_error({"name": "X", "responseHeaders": {"authorization": "SECRET"}})
    assert shown == '{"name":"X"}'
    assert describe_error(None) == describe_error("") == describe_error({}) == "unknown error"


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=12,
)
_KEYS = st.sampled_from(
    ["message", "code", "type", "name", "statusCode", "status", "providerStatus", "retryAfter"]
)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(
    error=st.dictionaries(_KEYS, _JSON, max_size=6) | _JSON,
    data=st.dictionaries(_KEYS, _JSON, max_size=4),
)
@example(error={"code": True, "statusCode": 429}, data={})
@example(error={"message": None}, data={"message": ["quota exceeded"]})
def test_any_host_error_is_classified_without_raising_and_never_leaks_headers(error: Any, data: Any) -> None:
    if isinstance(error, dict):
        secret = {"authorization": "SECRET-TOKEN"}
        error = {**error, "data": {**data, "responseHeaders": secret}, "responseHeaders": secret}
    observed = classify(error, "session-error", NOW, "p/m")
    assert observed is None or observed.kind in ("quota", "rate-limit")
    retrying = classify(error, "session-error", NOW, retrying=True)
    assert retrying is not None  # a retry status is always a limit
    assert observed is None or retrying.kind == observed.kind
    described = describe_error(error)
    assert isinstance(described, str) and described
    assert "SECRET-TOKEN" not in described
