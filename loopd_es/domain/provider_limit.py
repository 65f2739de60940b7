"""Provider-limit classification (docs/reference/loopd.md#s6, widened to every provider's wording): quota or
rate limit?

The reference knows OpenAI's words only; a goal on Anthropic, Google, OpenRouter, Azure, Bedrock or OpenCode's
own gateway then waited out OpenCode's retries (~90 s) before it fell back. So besides the rules of
docs/reference/loopd.md#s6, each provider's
documented status codes, error codes/types and messages count (``tests/fixtures/provider_errors/`` holds one
file of real wordings per provider), and a retry status (``retrying``) is a limit whatever its words: OpenCode
retries only what the provider said to retry later. The exclusions of docs/reference/loopd.md#s6 (auth,
context length, network ...) still
win over everything but a retry status.

Pure: the error is the JSON-like value the host reported (a dict, possibly with ``cause``/``data``, or a
string) and ``now`` is passed in. The result never holds the raw message or headers.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any, Final, Literal

import msgspec

from ..clock import parse_rfc3339, whole_ms
from ..events.identity import ProviderLimitFacts

RETRY_AFTER_CAP_SECONDS: Final = 31_536_000

_EXCLUDED: Final = re.compile(
    r"context.{0,20}(length|window|overflow)|maximum context|invalid.{0,10}(key|token)|unauthori[sz]ed"
    r"|authentication|network|ECONN|ENOTFOUND|max.?turn|cost.?budget|budget.?limit",
    re.IGNORECASE,
)
_QUOTA: Final = re.compile(
    r"\b(insufficient quota|quota (exceeded|exhausted)|exceeded.{0,20}quota|usage limit reached"
    r"|credit balance.{0,20}(low|exhausted|insufficient)"
    # OpenRouter (402), OpenCode Zen, Bedrock's service quotas
    r"|insufficient credits|requires more credits|free usage exceeded|exceeds the service quota)\b",
    re.IGNORECASE,
)
_RATE: Final = re.compile(
    r"\b(rate[ -]limit(ed| exceeded| reached| hit)|too many requests"
    # Anthropic "would exceed the rate limit", Azure "have exceeded token rate limit"
    r"|exceed(s|ed)? (the |your )?([\w-]+ )?rate limit"
    # Bedrock ThrottlingException "Rate exceeded" / "Too many tokens", Google RESOURCE_EXHAUSTED
    r"|rate exceeded|too many tokens|throttl(ed|ing)|resource (has been )?exhausted"
    # Anthropic 529 "Overloaded", OpenCode's retry status "Provider is overloaded"
    r"|overloaded)\b",
    re.IGNORECASE,
)
_QUOTA_CODES: Final = frozenset(
    {"insufficient_quota", "quota_exceeded", "servicequotaexceededexception", "insufficient_credits"}
)
_RATE_CODES: Final = frozenset(
    {
        "rate_limit_exceeded",  # OpenAI, OpenRouter
        "rate_limit_error",  # Anthropic 429
        "overloaded_error",  # Anthropic 529
        "resource_exhausted",  # Google (gRPC status)
        "throttlingexception",  # Bedrock
        "too_many_requests",  # OpenCode's gateway
        "ratelimitreached",
        "429",  # Azure sends the status as its error code
    }
)
_QUOTA_STATUS: Final = frozenset({402})  # OpenRouter: out of credits
_RATE_STATUS: Final = frozenset({429, 529})  # 529: Anthropic overloaded
_NUMERIC: Final = re.compile(r"^\d+(\.\d+)?$")


_NOT_TOLD: Final = frozenset({"responseHeaders", "responseBody", "metadata", "headers"})


def describe_error(error: Any) -> str:
    """The error's own message, as the reference keeps it (``lastError``, a blocker's ``Last error: ...``).

    A dict's ``message`` (or its ``data``'s or ``cause``'s); one without a message is shown as JSON without its
    headers and body; nothing at all is ``unknown error``.
    """
    if isinstance(error, str):
        return error or "unknown error"
    if isinstance(error, dict):
        for holder in (error, error.get("data"), error.get("cause")):
            if isinstance(holder, dict) and holder.get("message") not in (None, ""):
                return str(holder["message"])
        shown = _told(error)
        try:
            return msgspec.json.encode(shown).decode() if shown else "unknown error"
        except (TypeError, msgspec.EncodeError):
            return str(shown)
    return "unknown error" if error is None else str(error)


def _told(value: Any) -> Any:
    """``value`` without headers, bodies and metadata at any depth (they may carry credentials)."""
    if isinstance(value, dict):
        return {k: _told(v) for k, v in value.items() if k not in _NOT_TOLD}
    if isinstance(value, list):
        return [_told(v) for v in value]
    return value


def classify(
    error: Any,
    source: Literal["prompt-delivery", "session-error"],
    now: datetime,
    model: str | None = None,
    *,
    retrying: bool = False,
) -> ProviderLimitFacts | None:
    """The observation for ``error``, or ``None`` when it is not a provider limit.

    ``retrying``: ``error`` is a retry status (the host retries by itself), a rate limit unless it says quota.
    """
    wrapper = error if isinstance(error, dict) else {}
    cause = wrapper.get("cause")
    root: dict[str, Any] = (cause if isinstance(cause, dict) else {}) if cause else wrapper
    data = root.get("data") if isinstance(root.get("data"), dict) else {}
    assert isinstance(data, dict)
    status_code = _first_number(
        root.get("statusCode"), root.get("status"), data.get("statusCode"), data.get("status")
    )
    codes = {
        str(v).lower()
        for holder in (root, data)
        for key in ("code", "type", "name", "providerStatus")
        if isinstance(v := holder.get(key), str | int) and not isinstance(v, bool)
    }
    texts = [v for v in (root.get("message"), data.get("message"), error) if isinstance(v, str)]
    message = " ".join(texts)

    if not retrying and (status_code in (401, 403) or _EXCLUDED.search(message)):
        return None
    kind: Literal["quota", "rate-limit"]
    if codes & _QUOTA_CODES or status_code in _QUOTA_STATUS or _QUOTA.search(message):
        kind = "quota"
    elif retrying or codes & _RATE_CODES or status_code in _RATE_STATUS or _RATE.search(message):
        kind = "rate-limit"
    else:
        return None
    headers = root.get("responseHeaders") or data.get("responseHeaders") or {}
    retry_after = _first_present(
        root.get("retryAfter"),
        data.get("retryAfter"),
        headers.get("retry-after") if isinstance(headers, dict) else None,
    )
    return ProviderLimitFacts(
        kind=kind,
        source=source,
        observed_at=whole_ms(now),
        model=model,
        status_code=int(status_code) if status_code is not None else None,
        retry_at=_retry_at(retry_after, now),
    )


def _first_number(*values: Any) -> float | None:
    for value in values:
        if value is not None:
            if isinstance(value, int | float) and not isinstance(value, bool):
                return value
            return None
    return None


def _first_present(*values: Any) -> Any:
    for value in values:
        if value is not None:
            return value
    return None


def _retry_at(value: Any, now: datetime) -> datetime | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        if math.isfinite(value) and value >= 0:
            return whole_ms(now + timedelta(seconds=min(value, RETRY_AFTER_CAP_SECONDS)))
        return None
    if not isinstance(value, str):
        return None
    if _NUMERIC.match(value):
        return whole_ms(now + timedelta(seconds=min(float(value), RETRY_AFTER_CAP_SECONDS)))
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        try:
            moment = parse_rfc3339(value)
        except ValueError:
            return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return whole_ms(moment.astimezone(UTC))
