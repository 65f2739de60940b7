"""What a running engine is doing, where ``loopd-es engines`` can read it even while the store is down.

Each ``loopd-es run`` process keeps one small JSON file in a private runtime directory of this machine (beside
the tool sockets: ``$XDG_RUNTIME_DIR/loopd-es/engines-<hash of the store URL>/<pid>.json``), rewritten atomically
on every change of state (standing by, running, waiting for the store, stopped) and removed when it stops. It is
not in the log on purpose: it must say "waiting for the store since …" exactly when the store cannot be written.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ..clock import WALL, iso
from ..errors import UsageError
from ..log import parse_store_url
from .tool_server import private_socket_dir, socket_dir


def status_dir(store_url: str) -> Path:
    """The directory of this machine's engine status files for the log at ``store_url``."""
    digest = hashlib.sha256(log_key(store_url).encode()).hexdigest()[:12]
    return socket_dir() / f"engines-{digest}"


def log_key(store_url: str) -> str:
    """One name per log: a file log by its absolute path (``sqlite:.loopd/events.db`` names another log in
    every project directory), any other by its URL."""
    try:
        scheme, path, _ = parse_store_url(store_url)
    except UsageError:
        return store_url
    if scheme in ("sqlite", "ndjson") and not store_url.startswith(("postgres://", "postgresql://")):
        return f"{scheme}:{Path(path).expanduser().resolve()}"
    return store_url


def _started(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, from ``/proc``), to tell it from a later process
    that got the same pid; None where ``/proc`` does not say."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


class EngineStatus:
    """This process's status file."""

    def __init__(self, store_url: str, holder: str) -> None:
        self.path = status_dir(store_url) / f"{os.getpid()}.json"
        pid = os.getpid()
        self.doc: dict[str, Any] = {
            "pid": pid,
            "started": _started(pid),
            "holder": holder,
            "store": store_url,
        }

    def set(self, state: str, detail: str = "") -> None:
        """Record ``state`` (and why); a status that cannot be written never stops the engine."""
        if self.doc.get("state") == state and self.doc.get("detail") == detail:
            return
        self.doc.update(state=state, detail=detail, since=iso(WALL.now()))
        with contextlib.suppress(OSError):
            private_socket_dir(self.path.parent)
            tmp = self.path.with_suffix(".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as out:
                json.dump(self.doc, out)
            os.replace(tmp, self.path)

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()


def read_statuses(store_url: str) -> list[dict[str, Any]]:
    """The status of every engine of this machine on the log at ``store_url`` (files of dead processes skipped)."""
    found = []
    folder = status_dir(store_url)
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            doc = json.loads(path.read_text())
            os.kill(int(doc["pid"]), 0)
        except (OSError, ValueError, KeyError, TypeError):
            continue  # unreadable, or its process is gone (killed before it could remove the file)
        if doc.get("started") is not None and doc["started"] != _started(int(doc["pid"])):
            continue  # its process is gone, and another one has its pid
        found.append(doc)
    return found
