"""The terminal's width for help texts, without the imports ``shutil.get_terminal_size`` brings along."""

from __future__ import annotations

import os
import sys


def columns() -> int:
    """The terminal's width, found the way ``shutil.get_terminal_size`` finds it (``COLUMNS``, then standard
    output's terminal, else 80) without importing shutil (and with it bz2 and lzma)."""
    try:
        found = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        found = 0
    if found <= 0:
        try:
            found = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            found = 0
    return found if found > 0 else 80
