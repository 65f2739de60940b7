"""The concrete read models, one module each, and the registry the projector loads (``ALL``).

This package depends on ``loopd_es``, never the reverse: ``loopd-es project`` finds it by name
(:func:`loopd_es.projector.load_registry`). To add a read model, write a module with a class that has
``name``, ``version``, ``schema``, ``apply`` and ``reset`` (see :class:`loopd_es.projector.Projection`) and
add an instance to ``ALL``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .stream_stats import StreamStats

if TYPE_CHECKING:
    from loopd_es.projector import Projection

ALL: list[Projection] = [StreamStats()]

__all__ = ("ALL", "StreamStats")
