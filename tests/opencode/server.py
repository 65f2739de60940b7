"""A real ``opencode serve`` for the tests: isolated HOME/XDG/TMPDIR, offline, talking to the fake model server.

The OpenCode install comes from ``LOOPD_ES_TEST_OPENCODE`` (``tools/opencode_setup.sh`` makes it; ``.ci/run``
runs that). Without it the tests skip locally with that hint and fail under ``CI=true``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.components import skip_or_fail
from tests.waits import wait_until

if TYPE_CHECKING:
    from .fake_llm import FakeLLM

ENV = "LOOPD_ES_TEST_OPENCODE"
MODELS = ("good", "other", "slow", "burst", "limited", "quota", "broken", "badreq", "ra30", "anthropic429")


def opencode_dir() -> Path:
    """The pinned OpenCode install, or skip (fail under CI) with how to make one."""
    value = os.environ.get(ENV, "")
    if value and (Path(value) / "bin" / "opencode").exists():
        return Path(value)
    reason = f'no OpenCode for the tests: run eval "$(bash tools/opencode_setup.sh)" to set {ENV}'
    skip_or_fail(reason)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OpenCodeServer:
    """One ``opencode serve`` process in a directory of its own; ``url`` once :meth:`start` returned."""

    def __init__(self, root: Path, fake: FakeLLM, *, password: str | None = None) -> None:
        self.install = opencode_dir()
        self.root = root
        self.fake = fake
        self.password = password
        self.project = root / "project"
        self.home = root / "home"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def env(self) -> dict[str, str]:
        home = str(self.home)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": home,
            "XDG_CONFIG_HOME": f"{home}/.config",
            "XDG_DATA_HOME": f"{home}/.local/share",
            "XDG_CACHE_HOME": f"{home}/.cache",
            "XDG_STATE_HOME": f"{home}/.local/state",
            "TMPDIR": str(self.root / "tmp"),
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_SHARE": "1",
            "npm_config_registry": "http://127.0.0.1:9/",  # never reach out: everything is pre-installed
        }
        if self.password:
            env["OPENCODE_SERVER_PASSWORD"] = self.password
        return env

    def prepare(self, extra_config: dict[str, Any] | None = None) -> None:
        (self.root / "tmp").mkdir(parents=True, exist_ok=True)
        config_dirs = [self.home / ".config" / "opencode", self.project / ".opencode"]
        for directory in config_dirs:
            directory.mkdir(parents=True, exist_ok=True)
            for name in ("package.json", "package-lock.json"):
                shutil.copy(self.install / "plugin" / name, directory / name)
            if not (directory / "node_modules").exists():
                shutil.copytree(
                    self.install / "plugin" / "node_modules", directory / "node_modules", symlinks=True
                )
        config: dict[str, Any] = {
            "$schema": "https://opencode.ai/config.json",
            "enabled_providers": ["fake"],
            "model": "fake/good",
            "small_model": "fake/good",
            "share": "disabled",
            "autoupdate": False,
            "provider": {
                "fake": {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "Fake",
                    "options": {"baseURL": self.fake.base_url, "apiKey": "x"},
                    "models": {m: {"name": m.title(), "cost": {"input": 1.0, "output": 2.0}} for m in MODELS},
                }
            },
            **(extra_config or {}),
        }
        (self.project / "opencode.json").write_text(json.dumps(config, indent=2))

    def start(self, extra_config: dict[str, Any] | None = None, timeout: float = 60.0) -> OpenCodeServer:
        self.prepare(extra_config)
        with open(self.root / "serve.log", "ab") as log:  # the child keeps its own copy of the descriptor
            self.process = subprocess.Popen(
                [
                    str(self.install / "bin" / "opencode"),
                    "serve",
                    "--hostname",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                ],
                cwd=self.project,
                env=self.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

        def healthy() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"opencode serve exited with {self.process.returncode}: {self.tail()}")
            with urllib.request.urlopen(self._request("/global/health"), timeout=1) as reply:
                return bool(json.load(reply).get("healthy"))

        try:
            wait_until("opencode serve to answer healthy", healthy, within=timeout, ignoring=(OSError,))
        except AssertionError as e:
            self.stop()
            raise RuntimeError(f"{e}: {self.tail()}") from None
        return self

    def _request(self, path: str) -> urllib.request.Request:
        request = urllib.request.Request(self.url + path)
        if self.password:
            import base64

            token = base64.b64encode(f"opencode:{self.password}".encode()).decode()
            request.add_header("authorization", f"Basic {token}")
        return request

    def tail(self) -> str:
        log = self.root / "serve.log"
        return log.read_text(errors="replace")[-2000:] if log.exists() else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        self.process = None
