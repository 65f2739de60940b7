"""The host contract against the simulated host, its state in memory and in a file (what the CLI and the engine use)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import pytest

from loopd_es.host.sim_script import HostScript, ScriptAgent, ScriptModel
from loopd_es.host.simulated import SimulatedHost
from loopd_es.testing import HostContract, SimulatedWorker

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from loopd_es.host.events import EngineHost

SCRIPT = HostScript(
    models=(ScriptModel(provider="p", id="main"), ScriptModel(provider="p", id="other")),
    agents=(ScriptAgent(name="build"), ScriptAgent(name="plan")),
)


class TestSimulatedHostInMemory(HostContract):
    @pytest.fixture
    async def host(self) -> AsyncIterator[EngineHost]:
        host = SimulatedHost(SCRIPT)
        yield host
        await host.aclose()

    @pytest.fixture
    def worker(self) -> SimulatedWorker:
        return SimulatedWorker(("p/main", "p/other"), ("build", "plan"))


class TestSimulatedHostInAFile(TestSimulatedHostInMemory):
    @pytest.fixture
    async def host(self, tmp_path: Path) -> AsyncIterator[EngineHost]:
        script = tmp_path / "host.json"
        script.write_bytes(msgspec.json.encode(SCRIPT))
        host = SimulatedHost.from_file(script)
        yield host
        await host.aclose()
