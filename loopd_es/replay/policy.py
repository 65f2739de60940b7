"""A changed policy for ``loopd-es whatif``: the ``--set key=value`` settings, parsed and checked.

A policy changes only what the deciders read as configuration (a goal's limits and fallback order) or as an
engine fact (the retry backoff, the idle confirmation window); the recorded host observations stay as they were.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Final

import msgspec

from ..domain.goal_commands import RetryBackoff
from ..domain.rules import MAX_FALLBACK_MODELS, is_model_ref
from ..errors import UsageError

if TYPE_CHECKING:
    from ..events.goal import GoalConfig

_INT_LIMITS: Final = (
    "max_turns",
    "max_failures",
    "max_evaluator_rejections",
    "max_no_progress",
    "token_budget",
)
_ENGINE: Final = ("backoff_base_ms", "backoff_cap_ms", "confirm_idle_ms")
KEYS: Final = (*_INT_LIMITS, "cost_budget", "fallback_models", *_ENGINE)
"""Every key ``--set`` accepts, in the order ``whatif --help`` lists them."""


class Policy(msgspec.Struct, frozen=True, kw_only=True):
    """Goal settings to override (``None`` clears a limit) and engine facts to replace (``None`` keeps them)."""

    goal: dict[str, Any] = msgspec.field(default_factory=dict)
    backoff: RetryBackoff | None = None
    confirm_idle_ms: int | None = None

    @property
    def empty(self) -> bool:
        return not self.goal and self.backoff is None and self.confirm_idle_ms is None

    def apply(self, config: GoalConfig) -> GoalConfig:
        """``config`` with this policy's goal settings."""
        return msgspec.structs.replace(config, **self.goal) if self.goal else config

    def notes(self) -> list[str]:
        """What the user should know about these settings before reading the results."""
        if "max_no_progress" in self.goal:
            return [
                "max_no_progress: loopd-es counts a turn that ended without reported progress (opencode-loopd "
                "never does, so its limit never acts); a goal imported from loopd carries loopd's count"
            ]
        return []

    def describe(self) -> str:
        """``max_turns 5, fallback_models a/b,c/d``: the settings as the user gave them, for report lines."""
        parts = [f"{k} {_show(v)}" for k, v in self.goal.items()]
        if self.backoff is not None:
            parts.append(f"backoff {self.backoff.base_ms} ms doubling to {self.backoff.cap_ms} ms")
        if self.confirm_idle_ms is not None:
            parts.append(f"confirm_idle_ms {self.confirm_idle_ms}")
        return ", ".join(parts) or "the recorded policy"


def _show(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, tuple):
        return ",".join(value) or "(none)"
    return str(value)


def parse_policy(settings: list[str]) -> Policy:
    """``["max_turns=5", "fallback_models=a/b,c/d"]`` as a :class:`Policy`.

    :raises UsageError: naming the setting for an unknown key or a value of the wrong kind.
    """
    goal: dict[str, Any] = {}
    engine: dict[str, int] = {}
    seen: set[str] = set()
    for item in settings:
        key, eq, raw = item.partition("=")
        key, raw = key.strip().replace("-", "_"), raw.strip()
        if not eq or key not in KEYS:
            raise UsageError(f"--set {item!r}: expected KEY=VALUE with KEY one of {', '.join(KEYS)}")
        if key in seen:
            raise UsageError(f"--set {key} given twice; give each setting once")
        seen.add(key)
        if key in _ENGINE:
            engine[key] = _positive_int(key, raw, allow_none=False) or 0
        elif key == "fallback_models":
            goal[key] = _models(raw)
        elif key == "cost_budget":
            goal[key] = _dollars(raw)
        else:
            goal[key] = _positive_int(key, raw, allow_none=True)
    backoff = None
    if "backoff_base_ms" in engine or "backoff_cap_ms" in engine:
        default = RetryBackoff()
        backoff = RetryBackoff(
            base_ms=engine.get("backoff_base_ms", default.base_ms),
            cap_ms=engine.get("backoff_cap_ms", default.cap_ms),
        )
        if backoff.cap_ms < backoff.base_ms:
            raise UsageError(
                f"--set backoff_cap_ms={backoff.cap_ms} is below backoff_base_ms={backoff.base_ms}: the first "
                "retry waits the base and later ones double up to the cap; give a cap at least the base"
            )
    return Policy(goal=goal, backoff=backoff, confirm_idle_ms=engine.get("confirm_idle_ms"))


def _positive_int(key: str, raw: str, *, allow_none: bool) -> int | None:
    if allow_none and raw.lower() in ("none", "off"):
        return None
    value = int(raw) if raw.isascii() and raw.isdigit() else 0  # decimal digits only: not 1_0, not empty
    if value < 1:
        more = " or none" if allow_none else ""
        raise UsageError(f"--set {key}={raw}: expected a whole number >= 1{more}")
    return value


def _dollars(raw: str) -> float | None:
    if raw.lower() in ("none", "off", ""):
        return None
    try:
        value = float(raw.lstrip("$"))
    except ValueError:
        value = -1.0
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"--set cost_budget={raw}: expected a positive number of dollars or none")
    return value


def _models(raw: str) -> tuple[str, ...]:
    models = tuple(dict.fromkeys(m.strip() for m in raw.split(",") if m.strip()))
    bad = [m for m in models if not is_model_ref(m)]
    if bad:
        raise UsageError(f"--set fallback_models: {bad[0]!r} is not providerID/modelID")
    if len(models) > MAX_FALLBACK_MODELS:
        raise UsageError(f"--set fallback_models: at most {MAX_FALLBACK_MODELS} models")
    return models
