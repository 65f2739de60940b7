"""The contract suite ships in the installed package (#17 item 6): a module outside this repository's tests,
with no conftest, subclasses it and runs it against the in-memory reference backend."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXTERNAL = """
import uuid

import pytest

from loopd_es.log import open_store
from loopd_es.testing import LogStoreContract, MemoryLog


class TestTheirLog(LogStoreContract):
    @pytest.fixture
    def store_url(self):
        name = uuid.uuid4().hex
        yield f"memory:{name}"
        MemoryLog.forget(name)

    @pytest.fixture
    async def store(self, store_url):
        async with await open_store(store_url) as s:
            yield s
"""


def test_a_backend_author_runs_the_contract_from_the_installed_package(tmp_path: Path) -> None:
    (tmp_path / "test_their_log.py").write_text(EXTERNAL)
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_their_log.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    passed = int(r.stdout.strip().splitlines()[-1].split()[0])
    assert passed >= 80, r.stdout[-500:]
