"""The engine's timings, apart from the engine so each part can take the ones it needs."""

from __future__ import annotations

import msgspec


class EngineConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The engine's timings (docs/reference/loopd.md#s5); tests shorten them, nothing else should need to."""

    confirm_idle_ms: int = 2000
    maintenance_ms: int = 30_000
    idle_recover_ms: int = 180_000
    idle_unconfirmed_ms: int = 300_000
    stuck_running_ms: int = 600_000
    tool_ttl_ms: int = 30_000
    unknown_threshold: int = 3
