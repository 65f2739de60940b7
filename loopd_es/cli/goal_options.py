"""``goal create``'s options, made from the ``loopd_create_goal`` Struct: one flag per tool field, same bounds.

The flags, their types and help come from :data:`~loopd_es.engine.tool_args.CREATE_OPTIONS` and the Struct's
JSON schema, and the values are decoded by the Struct itself, so the CLI refuses what the tool refuses, in one
line naming the flag (exit 2).
"""

from __future__ import annotations

import argparse
import re
from typing import Any

import msgspec

from ..engine.tool_args import CREATE_OPTIONS, CreateGoalArgs
from ..errors import UsageError
from .options import decimal_integer, decimal_number

_TYPES: dict[str, Any] = {"integer": decimal_integer, "number": decimal_number, "string": str}


def _properties() -> dict[str, dict[str, Any]]:
    props: dict[str, dict[str, Any]] = msgspec.json.schema(CreateGoalArgs)["$defs"]["CreateGoalArgs"][
        "properties"
    ]
    return props


def add_create_options(p: argparse.ArgumentParser) -> None:
    """Add ``--objective`` and every goal option to ``goal create``'s parser."""
    p.add_argument("--objective", required=True, metavar="TEXT")
    props = _properties()
    for name, option in CREATE_OPTIONS.items():
        schema = props[name]
        about = (
            "the goal does not write the workspace" if name == "workspaceWrite" else schema.get("description")
        )
        help_ = f"{about} [tool field {name}]".replace("%", "%%")
        if option.metavar is None:
            p.add_argument(option.flag, dest=name, action="store_true", help=help_)
        elif schema.get("type") == "array":
            kind = _TYPES[schema["items"]["type"]]
            p.add_argument(
                option.flag, dest=name, action="append", type=kind, metavar=option.metavar, help=help_
            )
        else:
            p.add_argument(
                option.flag, dest=name, type=_TYPES[schema["type"]], metavar=option.metavar, help=help_
            )


def create_options(args: argparse.Namespace) -> dict[str, Any]:
    """The options given on the command line as :class:`~loopd_es.domain.goal_commands.CreateGoal` keywords.

    :raises UsageError: naming the flag when a value is out of the tool's bounds.
    """
    given: dict[str, Any] = {"name": args.name, "objective": args.objective}
    for name, option in CREATE_OPTIONS.items():
        value = getattr(args, name)
        if option.metavar is None:  # a switch: only its presence says something
            if value:
                given[name] = name != "workspaceWrite"  # --read-only is workspaceWrite false
        elif value is not None:
            given[name] = value
    try:
        decoded = msgspec.convert(given, type=CreateGoalArgs, strict=True)
    except msgspec.ValidationError as e:
        raise UsageError(f"goal create: {_flag_named(str(e))}") from None
    return decoded.options()


def _flag_named(message: str) -> str:
    """msgspec's ``- at `$.maxTurns``` as ``- at --max-turns``."""

    def flag(match: re.Match[str]) -> str:
        option = CREATE_OPTIONS.get(match.group(1))
        return option.flag if option else match.group(1)

    return re.sub(r"`\$\.(\w+)(?:\[\d+\])?`", flag, message)


def in_flags(message: str) -> str:
    """A domain message naming tool fields (``scheduleEveryMs must be ...``) as the flags that set them."""
    return _FIELD.sub(lambda m: CREATE_OPTIONS[m.group(0)].flag, message)


_FIELD = re.compile(  # the camel-case names only: "model" and "agent" are words too
    r"\b(?:"
    + "|".join(sorted((f for f in CREATE_OPTIONS if not f.islower()), key=len, reverse=True))
    + r")\b"
)
