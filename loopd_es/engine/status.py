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
from .tool_server import private_socket_dir, socket_dir


def status_dir(store_url: str) -> Path:
    """The directory of this machine's engine status files for the log at ``store_url``."""
    digest = hashlib.sha256(store_url.encode()).hexdigest()[:12]
    return socket_dir() / f"engines-{digest}"


class EngineStatus:
    """This process's status file."""

    def __init__(self, store_url: str, holder: str) -> None:
        self.path = status_dir(store_url) / f"{os.getpid()}.json"
        self.doc: dict[str, Any] = {"pid": os.getpid(), "holder": holder, "store": store_url}

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
        found.append(doc)
    return found
