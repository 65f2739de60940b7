"""The log contract as a test suite: run it against your own :class:`~loopd_es.log.base.LogStore` backend.

Install with ``pip install 'loopd-es[testing]'`` (it needs pytest), then subclass the contract in a test module
and give it two fixtures: ``store_url`` (a fresh, empty log) and ``store`` (an open store on it)::

    import pytest
    from ..testing import LogStoreContract

    class TestMyLog(LogStoreContract):
        @pytest.fixture
        def store_url(self, tmp_path):
            return f"mylog:{tmp_path / 'log'}"

        @pytest.fixture
        async def store(self, store_url):
            async with await MyLog.open(store_url) as s:
                yield s

Every test is async and runs on anyio's pytest plugin (asyncio). :class:`IntegrityContract` adds what a backend
that stores payload bytes in files must get right (odd raw payloads, foreign files). :class:`MemoryLog`
(``memory:NAME``) is the reference backend that passes the contract, for fast unit tests.

:class:`HostContract` does the same for worker hosts (:mod:`loopd_es.testing.host_contract`): the simulated
host and OpenCode's run it, so the fake cannot drift from the real thing.
"""

from __future__ import annotations

from ..log.memory import MemoryLog as MemoryLog
from .contract import LogStoreContract as LogStoreContract
from .contract_commit import CommitContract as CommitContract
from .contract_integrity import IntegrityContract as IntegrityContract
from .helpers import assert_log_invariants as assert_log_invariants
from .helpers import batches as batches
from .helpers import everything as everything
from .helpers import flat as flat
from .helpers import new as new
from .helpers import positions as positions
from .helpers import stream_events as stream_events
from .host_contract import HostContract as HostContract
from .host_worker import ContractWorker as ContractWorker
from .host_worker import Recorder as Recorder
from .host_worker import SimulatedWorker as SimulatedWorker
from .host_worker import TurnKind as TurnKind

__all__ = (
    "CommitContract",
    "ContractWorker",
    "HostContract",
    "IntegrityContract",
    "LogStoreContract",
    "MemoryLog",
    "Recorder",
    "SimulatedWorker",
    "TurnKind",
    "assert_log_invariants",
    "batches",
    "everything",
    "flat",
    "new",
    "positions",
    "stream_events",
)
