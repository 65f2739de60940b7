"""Crash points live in :mod:`loopd_es.sagas.crashpoints` (the sagas use them and never import ``app``)."""

from __future__ import annotations

from ..sagas.crashpoints import CRASH_AT_ENV, CRASH_TRACE_ENV, Crash, arm, crashpoint

__all__ = ["CRASH_AT_ENV", "CRASH_TRACE_ENV", "Crash", "arm", "crashpoint"]
