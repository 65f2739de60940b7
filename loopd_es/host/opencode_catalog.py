"""OpenCode's model and agent catalogs: what ``/provider`` and ``/agent`` answer, as the host port's catalogs,
and the short-lived copies a prompt or switch is validated against.

OpenCode accepts any model or agent name and fails later, so a switch is checked here first: a model must be
offered by a connected provider, an agent must be visible (hidden ones are dropped).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final, TypeVar

from ..clock import now_rfc3339
from .base import AgentCatalog, AgentInfo, ModelCatalog, ModelInfo, ProviderInfo, QuotaReport
from .errors import HostRejectedError
from .opencode_wire import _AGENT_MODES

if TYPE_CHECKING:
    from . import opencode_json as j

CATALOG_TTL_S: Final = 30.0
"""How long a model or agent catalog read for validating a prompt is reused (it rarely changes; every prompt
would otherwise pay two more round trips, one of them the whole provider list)."""

C = TypeVar("C", ModelCatalog, AgentCatalog)


def model_catalog(reply: j.Providers | None, source: str) -> ModelCatalog:
    """``GET /provider``'s answer as a catalog; ``None`` (the read failed) is an ``unavailable`` one."""
    now = now_rfc3339()
    quota = QuotaReport(source=source, observed_at=now)
    if reply is None:
        return ModelCatalog(
            capability="unavailable", source=source, observed_at=now, switching="next-prompt", quota=quota
        )
    connected = set(reply.connected)
    providers, models = [], []
    for provider in reply.all:
        pid = provider.id
        providers.append(ProviderInfo(provider_id=pid, name=provider.name or pid, connected=pid in connected))
        for model_id, model in provider.models.items():
            models.append(
                ModelInfo(
                    provider_id=pid,
                    model_id=model_id,
                    name=model.name or model_id,
                    usable=pid in connected,
                    context_limit=model.limit.context,
                    output_limit=model.limit.output,
                )
            )
    return ModelCatalog(
        capability="supported",
        source=source,
        observed_at=now,
        switching="next-prompt",
        providers=tuple(providers),
        models=tuple(models),
        quota=quota,
    )


def agent_catalog(reply: list[j.AgentEntry] | None, source: str) -> AgentCatalog:
    """``GET /agent``'s answer as a catalog, hidden agents dropped; ``None`` is an ``unavailable`` one."""
    now = now_rfc3339()
    if reply is None:
        return AgentCatalog(capability="unavailable", source=source, observed_at=now, switching="next-prompt")
    agents = tuple(
        AgentInfo(name=a.name, mode=_AGENT_MODES[a.mode or "primary"], description=a.description)
        for a in reply
        if not a.hidden and (a.mode or "primary") in _AGENT_MODES
    )
    return AgentCatalog(
        capability="supported", source=source, observed_at=now, switching="next-prompt", agents=agents
    )


class CatalogChecks:
    """Refuse a model or agent the server does not offer, from catalogs kept :data:`CATALOG_TTL_S`; a name not
    found is looked up once more, fresh (a provider may just have connected). A failed read is not kept, and
    a server whose catalog cannot be read is not second-guessed."""

    def __init__(
        self, models: Callable[[], Awaitable[ModelCatalog]], agents: Callable[[], Awaitable[AgentCatalog]]
    ) -> None:
        self._models = models
        self._agents = agents
        self._kept: dict[str, tuple[float, ModelCatalog | AgentCatalog]] = {}

    async def model(self, operation: str, session_id: str | None, model: str) -> None:
        """:raises HostRejectedError: when ``model`` is not usable here."""
        catalog = await self._cached("models", self._models)
        if catalog.capability == "supported" and not catalog.usable(model):
            catalog = await self._cached("models", self._models, fresh=True)
        if catalog.capability == "supported" and not catalog.usable(model):
            raise HostRejectedError(
                operation, session_id=session_id, detail=f"model {model!r} is not usable here"
            )

    async def agent(self, operation: str, session_id: str | None, agent: str) -> None:
        """:raises HostRejectedError: when ``agent`` is not offered here."""
        catalog = await self._cached("agents", self._agents)
        if catalog.capability == "supported" and agent not in catalog.names():
            catalog = await self._cached("agents", self._agents, fresh=True)
        if catalog.capability == "supported" and agent not in catalog.names():
            raise HostRejectedError(
                operation, session_id=session_id, detail=f"agent {agent!r} is not offered here"
            )

    async def _cached(self, key: str, read: Callable[[], Awaitable[C]], *, fresh: bool = False) -> C:
        now = time.monotonic()
        found = self._kept.get(key)
        if fresh or found is None or now - found[0] > CATALOG_TTL_S:
            value = await read()
            if value.capability != "supported":
                return value
            self._kept[key] = (now, value)
            return value
        return found[1]  # type: ignore[return-value]  # stored under the key of its own kind
