"""Worker hosts: the port (:class:`WorkerHost`) and its backends, opened by URL.

``sim:PATH`` is the simulated host scripted by ``PATH`` (JSON, or TOML when it ends in ``.toml``; a missing
file gives the default catalog), with its live state in ``<stem>.state.json`` beside it;
``sim:PATH?hold=prompt,switch_model`` also holds those calls until ``loopd-es host release`` (:mod:`.holds`). It is the default
(``sim:.loopd/host.json``, or ``$LOOPD_ES_HOST``). ``opencode:http://HOST:PORT`` is a running ``opencode serve`` (:mod:`loopd_es.host.opencode`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final
from urllib.parse import parse_qs

import anyio.to_thread

from .base import AgentCatalog as AgentCatalog
from .base import ModelCatalog as ModelCatalog
from .base import SessionIdentity as SessionIdentity
from .base import WorkerHost as WorkerHost
from .errors import HostConfigError as HostConfigError
from .errors import HostError as HostError
from .errors import ProviderError as ProviderError
from .errors import ProviderErrorInfo as ProviderErrorInfo
from .holds import HeldHost as HeldHost
from .holds import Holds as Holds
from .holds import check_calls
from .simulated import SimulatedHost as SimulatedHost

DEFAULT_HOST: Final = "sim:.loopd/host.json"
HOST_ENV: Final = "LOOPD_ES_HOST"

__all__ = (
    "DEFAULT_HOST",
    "HOST_ENV",
    "AgentCatalog",
    "HostConfigError",
    "HeldHost",
    "Holds",
    "HostError",
    "ModelCatalog",
    "ProviderError",
    "ProviderErrorInfo",
    "SessionIdentity",
    "SimulatedHost",
    "WorkerHost",
    "host_url",
    "open_host",
)


def host_url(explicit: str | None = None) -> str:
    """The host the user asked for: ``explicit`` (``--host``), then ``$LOOPD_ES_HOST``, then the default."""
    return explicit or os.environ.get(HOST_ENV) or DEFAULT_HOST


async def open_host(url: str) -> WorkerHost:
    """Open the host at ``url``.

    :raises HostConfigError: for an unknown scheme, an empty path, an invalid simulated-host script or a
        malformed OpenCode URL.
    """
    text = url.strip()
    scheme, sep, rest = text.partition(":")
    if sep and scheme == "sim":
        path = rest.removeprefix("//")
    elif not sep or (len(scheme) <= 1 and text.endswith((".json", ".toml"))):
        path = text  # a bare script path (a one-letter "scheme" is a Windows drive)
    elif scheme == "opencode":
        from .opencode import OpenCodeHost  # httpx is imported only by those who drive OpenCode

        return OpenCodeHost.from_url(text)
    elif scheme in ("http", "https"):
        raise HostConfigError(url, f"say which kind of host: opencode:{text} for an OpenCode server")
    else:
        raise HostConfigError(url, f"unknown host scheme {scheme!r}; use sim:FILE (e.g. {DEFAULT_HOST})")
    path, _, query = path.partition("?")
    if not path:
        raise HostConfigError(url, f"no script path; use e.g. {DEFAULT_HOST}")
    holds = _sim_holds(url, query)
    host = await anyio.to_thread.run_sync(SimulatedHost.from_file, Path(path))
    if holds:
        await host.hold(*holds)
    return host


def _sim_holds(url: str, query: str) -> tuple[str, ...]:
    """The calls a ``sim:PATH?hold=prompt,switch_model`` URL holds (armed when the host is opened).

    :raises HostConfigError: for another option or a call that cannot be held.
    """
    calls: list[str] = []
    for key, values in parse_qs(query, keep_blank_values=True).items():
        if key != "hold":
            raise HostConfigError(url, f"unknown option {key!r}; the simulated host takes ?hold=CALL,...")
        calls.extend(c.strip() for v in values for c in v.split(",") if c.strip())
    return check_calls(calls, url)
