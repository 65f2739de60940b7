"""Provider-limit classification, exactly as reference §6: is this host error a quota or a rate limit?

Pure: the error is the JSON-like value the host reported (a dict, possibly with ``cause``/``data``, or a
string) and ``now`` is passed in. The result never holds the raw message or headers.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any, Final, Literal

from .state import ProviderLimit

RETRY_AFTER_CAP_SECONDS: Final = 31_536_000

_EXCLUDED: Final = re.compile(
    r"context.{0,20}(length|window|overflow)|maximum context|invalid.{0,10}(key|token)|unauthori[sz]ed"
    r"|authentication|network|ECONN|ENOTFOUND|max.?turn|cost.?budget|budget.?limit",
    re.IGNORECASE,
)
_QUOTA: Final = re.compile(
    r"\b(insufficient quota|quota (exceeded|exhausted)|exceeded.{0,20}quota|usage limit reached"
    r"|credit balance.{0,20}(low|exhausted|insufficient))\b",
    re.IGNORECASE,
)
_RATE: Final = re.compile(r"\b(rate[ -]limit(ed| exceeded| reached| hit)|too many requests)\b", re.IGNORECASE)
_NUMERIC: Final = re.compile(r"^\d+(\.\d+)?$")


def iso(moment: datetime) -> str:
    """``2026-10-07T12:00:00.000Z``: the reference's ISO form (milliseconds, UTC), so strings sort as times."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def classify(
    error: Any, source: Literal["prompt-delivery", "session-error"], now: datetime, model: str | None = None
) -> ProviderLimit | None:
    """The observation for ``error``, or ``None`` when it is not a provider limit."""
    wrapper = error if isinstance(error, dict) else {}
    cause = wrapper.get("cause")
    root: dict[str, Any] = (cause if isinstance(cause, dict) else {}) if cause else wrapper
    data = root.get("data") if isinstance(root.get("data"), dict) else {}
    assert isinstance(data, dict)
    status_code = _first_number(
        root.get("statusCode"), root.get("status"), data.get("statusCode"), data.get("status")
    )
    code = root.get("code") if root.get("code") is not None else data.get("code")
    texts = [v for v in (root.get("message"), data.get("message"), error) if isinstance(v, str)]
    message = " ".join(texts)

    if status_code in (401, 403) or _EXCLUDED.search(message):
        return None
    kind: Literal["quota", "rate-limit"]
    if code in ("insufficient_quota", "quota_exceeded") or _QUOTA.search(message):
        kind = "quota"
    elif status_code == 429 or code == "rate_limit_exceeded" or _RATE.search(message):
        kind = "rate-limit"
    else:
        return None
    headers = root.get("responseHeaders") or data.get("responseHeaders") or {}
    retry_after = _first_present(
        root.get("retryAfter"),
        data.get("retryAfter"),
        headers.get("retry-after") if isinstance(headers, dict) else None,
    )
    return ProviderLimit(
        kind=kind,
        source=source,
        observed_at=iso(now),
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


def _retry_at(value: Any, now: datetime) -> str | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        if math.isfinite(value) and value >= 0:
            return iso(now + timedelta(seconds=min(value, RETRY_AFTER_CAP_SECONDS)))
        return None
    if not isinstance(value, str):
        return None
    if _NUMERIC.match(value):
        return iso(now + timedelta(seconds=min(float(value), RETRY_AFTER_CAP_SECONDS)))
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return iso(moment)
