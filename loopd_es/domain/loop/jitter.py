"""Deterministic jitter, random fallback and the adaptive clamp, bit-compatible with opencode-plugin-loop.

docs/reference/loop-plugin.md#s3-5, #s3-6: three tiers capped by interval, a bucket as long as the interval,
32-bit FNV-1a over
``"{id}-{bucket}"``, and JavaScript's half-up rounding (Python's ``round`` rounds half to even and would
differ on exact halves).
"""

from __future__ import annotations

import math
from typing import Final

MIN_INTERVAL_MS: Final = 1000
DEFAULT_ADAPTIVE_MIN_MS: Final = 60_000
DEFAULT_ADAPTIVE_MAX_MS: Final = 3_600_000
_FNV_OFFSET: Final = 0x811C9DC5
_FNV_PRIME: Final = 0x01000193


def js_round(x: float) -> int:
    """``Math.round``: halves go up toward +infinity (``-2.5`` -> ``-2``)."""
    return math.floor(x + 0.5)


def fnv1a(text: str) -> int:
    """32-bit FNV-1a over the UTF-16 code units of ``text``."""
    h = _FNV_OFFSET
    data = text.encode("utf-16-le")
    for i in range(0, len(data), 2):
        h ^= data[i] | (data[i + 1] << 8)
        h = (h * _FNV_PRIME) & 0xFFFFFFFF
    return h


def max_jitter_ms(interval_ms: float) -> float:
    """The tier cap: short < 5 min, medium < 1 h, long."""
    if interval_ms < 300_000:
        return min(15_000, interval_ms / 2)
    if interval_ms < 3_600_000:
        return min(interval_ms * 0.05, 60_000)
    return 1_800_000


def jitter_offset(task_id: str, interval_ms: float, at: int) -> int:
    """The offset added to ``at + interval`` for task ``task_id`` anchored at ``at`` (epoch ms)."""
    bucket = math.floor(at / max(1000, interval_ms))
    r = (fnv1a(f"{task_id}-{bucket}") % 1_000_000) / 1_000_000
    return js_round((2 * r - 1) * max_jitter_ms(interval_ms))


def normalise_bounds(min_ms: float | None, max_ms: float | None) -> tuple[int, int]:
    """Missing, non-finite or negative bounds take the defaults; floored; swapped when reversed."""

    def ok(v: float | None, default: int) -> int:
        if v is None or not math.isfinite(v) or v < 0:
            return default
        return math.floor(v)

    lo, hi = ok(min_ms, DEFAULT_ADAPTIVE_MIN_MS), ok(max_ms, DEFAULT_ADAPTIVE_MAX_MS)
    return (hi, lo) if lo > hi else (lo, hi)


def fallback_due(now: int, min_ms: int, max_ms: int, u: float) -> int:
    """``R(now)``: a uniform draw ``u`` in [0, 1) mapped onto [now + min, now + max], both inclusive."""
    if not math.isfinite(u) or u < 0:
        u = 0.0
    u = min(u, 1 - 1e-12)
    return now + min_ms + math.floor(u * (max_ms - min_ms + 1))


def clamp_due(now: int, requested_at: float, min_ms: int, max_ms: int) -> int:
    """A model's requested time clamped into the task's window; a non-finite request counts as the minimum."""
    delay = requested_at - now if math.isfinite(requested_at) else min_ms
    return now + math.floor(min(max(delay, min_ms), max_ms))
