"""Crash points: named places where a test can make the process die (``kill -9``) to prove recovery works.

Set ``LOOPD_ES_CRASH_AT=K`` and the K-th crash point reached by this process sends itself SIGKILL: no
``finally``, no flush, exactly like a power cut after the last fsync. ``LOOPD_ES_CRASH_TRACE=PATH`` appends
each point's number and label to PATH (fsynced) so a test can count the points of a run first. In-process tests
use :func:`arm` instead, which raises :class:`Crash` (a ``BaseException``, so nothing catches it by accident).
Both are inert unless set: production pays one dict lookup per point.
"""

from __future__ import annotations

import os
import signal
from typing import Final

CRASH_AT_ENV: Final = "LOOPD_ES_CRASH_AT"
CRASH_TRACE_ENV: Final = "LOOPD_ES_CRASH_TRACE"


class Crash(BaseException):
    """Raised at an armed crash point in-process: the test's stand-in for SIGKILL."""


_count = 0
_armed: int | None = None


def arm(at: int | None) -> None:
    """Raise :class:`Crash` at the ``at``-th crash point from now (``None`` disarms); for in-process tests."""
    global _armed, _count
    _armed, _count = at, 0


def crashpoint(label: str) -> None:
    """Count one crash point; die here when this is the one the environment or :func:`arm` names."""
    global _count
    _count += 1
    trace = os.environ.get(CRASH_TRACE_ENV)
    if trace:
        fd = os.open(trace, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{_count} {label}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
    target = os.environ.get(CRASH_AT_ENV)
    if target and target.isdigit() and int(target) == _count:
        os.kill(os.getpid(), signal.SIGKILL)
    if _armed is not None and _armed == _count:
        raise Crash(f"crash point {_count}: {label}")
