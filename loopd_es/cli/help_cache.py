"""The overview help (``loopd-es --help``) kept as text, so printing it needs no parser.

argparse renders it from :mod:`.main`'s command table and :mod:`.options`, at the terminal's width
(:mod:`.terminal`), in the running Python's formatting; the file's name holds a checksum of all of that, so any
change renders it again.
It is kept only where no gettext catalogue could translate argparse's words (the text would depend on the
language), in ``$XDG_CACHE_HOME/loopd-es`` (``~/.cache/loopd-es``); a cache that cannot be written is no error,
the help is then rendered each time.
"""

from __future__ import annotations

import os
import sys
import zlib

from .terminal import columns

_SOURCES = ("main.py", "options.py", "terminal.py")  # terminal.py: the width the help is rendered at


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "loopd-es")


def _path() -> str | None:
    """The cache file for this Python, this width and these sources (``None``: the help may be translated)."""
    if os.path.isdir(os.path.join(sys.base_prefix, "share", "locale")):
        return None  # where gettext could find a catalogue, argparse's words depend on the language
    here = os.path.dirname(os.path.abspath(__file__))
    check = zlib.crc32(sys.version.encode())
    try:
        for name in _SOURCES:
            with open(os.path.join(here, name), "rb") as source:
                check = zlib.crc32(source.read(), check)
    except OSError:
        return None
    return os.path.join(cache_dir(), f"overview-{check:08x}-{columns()}.txt")


def cached_overview() -> str | None:
    """The overview help as last rendered for this Python, width and sources, or ``None``."""
    path = _path()
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as kept:
            return kept.read() or None
    except (OSError, UnicodeDecodeError):
        return None


def keep_overview(text: str) -> None:
    """Keep the overview just rendered (written whole or not at all; other builds' files are removed)."""
    path = _path()
    if path is None:
        return
    folder, name = os.path.split(path)
    stamp = name.rsplit("-", 1)[0]
    try:
        os.makedirs(folder, exist_ok=True)
        for old in os.listdir(folder):
            if old.startswith("overview-") and not old.startswith(stamp + "-"):
                os.unlink(os.path.join(folder, old))
        temporary = f"{path}.{os.getpid()}.tmp"
        with open(temporary, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(temporary, path)
    except OSError:
        return
