"""The installed loopd-es's version: pyproject.toml is the one place it is written, read back from the package
metadata (``loopd_es.__version__`` and ``loopd-es --version`` both ask here)."""

from __future__ import annotations


def version() -> str:
    """The version pip installed, or ``0+unknown`` for a source tree on ``sys.path`` that was never installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("loopd-es")
    except PackageNotFoundError:
        return "0+unknown"
