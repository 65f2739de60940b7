"""The one shape an id may have, and the only way to turn an id into a path.

Ids come from users (the CLI), from other programs (an imported loopd project, a worker's tool calls) and
from callers of the Python API, and some of them become file names (``commands/<id>.log``) and stream
names (``command-<id>``, ``goal-<id>``). An id like ``../../etc/x`` would then name a file outside the
store, so every id is checked once where it enters, against one shape that cannot spell a path:

    1 to 128 characters of ``A-Z a-z 0-9 . _ -``, the first a letter or a digit

(no separator, no ``..`` component, nothing a terminal interprets). UUIDs, ``g1``, ``goal-7`` and the
ids loopd writes all fit. :func:`path_under` is the only way a module builds a path from an id: it checks
the id again and that the result stays directly under its root, so a missed check upstream fails loudly
instead of touching another file.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from .errors import UsageError

ID_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
ID_SHAPE: Final = "1-128 characters of letters, digits, '.', '_' and '-', starting with a letter or digit"


class InvalidIdError(UsageError):
    """Raised when an id does not have the one allowed shape (it could name a path outside the store)."""

    def __init__(self, kind: str, value: object, where: str = "") -> None:
        self.kind = kind
        self.value = value
        shown = ascii(value) if isinstance(value, str) else type(value).__name__
        if isinstance(value, str) and len(value) > 80:
            shown = ascii(value[:80]) + "..."
        place = f"{where}: " if where else ""
        super().__init__(f"{place}invalid {kind} id {shown}: ids are {ID_SHAPE}")


def is_valid_id(value: object) -> bool:
    """True when ``value`` is a string of the allowed shape."""
    return isinstance(value, str) and ID_RE.fullmatch(value) is not None


def check_id(kind: str, value: object, where: str = "") -> str:
    """``value`` itself when it is a valid id.

    :raises InvalidIdError: naming ``kind`` (``command``, ``goal``...) and ``where`` it came from.
    """
    if not is_valid_id(value):
        raise InvalidIdError(kind, value, where)
    assert isinstance(value, str)
    return value


def path_under(root: Path, kind: str, value: str, suffix: str = "") -> Path:
    """``root/<value><suffix>``, refused unless ``value`` is a valid id and the result is directly under ``root``.

    :raises InvalidIdError: for an id of another shape (nothing is touched).
    """
    name = check_id(kind, value) + suffix
    path = root / name
    if path.parent != root or path.name != name or "/" in suffix or "\0" in suffix:
        raise InvalidIdError(kind, value, f"path {str(path)!r} is not directly under {str(root)!r}")
    return path


class UnknownGoalError(UsageError):
    """Raised when no goal (or more than one) has an id equal to or starting with what was given."""

    def __init__(self, text: str, matches: list[str]) -> None:
        self.text = text
        self.matches = matches
        if not matches:
            message = f"no goal matches {text!r}; `loopd-es goals --all` lists the goals and their ids"
        else:
            shown = ", ".join(matches[:5]) + (", ..." if len(matches) > 5 else "")
            message = (
                f"goal id prefix {text!r} is ambiguous ({len(matches)} goals: {shown}); give more characters"
            )
        super().__init__(message)


def resolve_goal_id(text: str, ids: Iterable[str]) -> str:
    """The goal id ``text`` is, or the one id it starts (an empty text names none).

    Every command that takes a goal id resolves it here, so they all accept and refuse the same texts.

    :raises UnknownGoalError: when no goal or several goals match.
    """
    matches = sorted(i for i in ids if text and i.startswith(text))
    if text in matches or len(matches) == 1:
        return text if text in matches else matches[0]
    raise UnknownGoalError(text, matches)
