"""The command tools' arguments (``loopd_command_*``, docs/reference/loopd.md#s3-17), one strict Struct per
tool.

Numbers the reference checks with its own words (sizes, ``timeout_seconds``, byte counts) are JSON numbers here
and keep those checks in :mod:`.command_tools`; the Struct only bounds them so that no value can overflow what
follows (``timeout_seconds: 1e19`` is refused naming the field, not answered with a traceback).
"""

from __future__ import annotations

from typing import Annotated, Final

from msgspec import UNSET, Meta, UnsetType

from .tool_spec import ToolArgs

_ID_DOC: Final = "the command's id (as loopd_command_start returned it; a unique prefix will do)"
CommandId = Annotated[str, Meta(max_length=200, description=_ID_DOC)]
Size = Annotated[float, Meta(le=10_000)]
Regex = Annotated[str, Meta(max_length=10_000)]
Bytes = Annotated[float, Meta(le=2**53)]


def _doc(text: str) -> Meta:
    return Meta(description=text)


class _Command(ToolArgs, frozen=True, kw_only=True):
    command_id: CommandId


class StartArgs(ToolArgs, frozen=True, kw_only=True):
    title: Annotated[str, Meta(max_length=400, description="Short human label for the session.")]
    command: Annotated[str, Meta(max_length=4096, description='Executable to spawn (e.g. "bun", "python3").')]
    args: (
        Annotated[
            tuple[str, ...],
            Meta(max_length=10_000, description="Arguments, one per element (no shell quoting needed)."),
        ]
        | UnsetType
    ) = UNSET
    cwd: Annotated[str, _doc("Working directory (default: the project directory).")] | UnsetType = UNSET
    goal_id: Annotated[str, _doc("A goal this command belongs to (display only).")] | UnsetType = UNSET
    notify_on_exit: (
        Annotated[
            bool,
            _doc(
                "Tell this session when the command ends (default: any exit or loss, not a terminate; "
                "false: never; true: always)."
            ),
        ]
        | UnsetType
    ) = UNSET
    cols: Annotated[Size, _doc("Terminal columns (default 80).")] | UnsetType = UNSET
    rows: Annotated[Size, _doc("Terminal rows (default 24).")] | UnsetType = UNSET
    env: (
        Annotated[dict[str, str], _doc("Extra environment variables; values are never persisted.")]
        | UnsetType
    ) = UNSET
    timeout_seconds: (
        Annotated[
            float, Meta(le=315_360_000, description="Terminate after this many seconds (positive integer).")
        ]
        | UnsetType
    ) = UNSET
    shell: Annotated[bool, _doc("Run through /bin/sh -c with every word quoted.")] | UnsetType = UNSET
    watch_filter: (
        Annotated[Regex, _doc("Regex: matching lines are recorded as watch pushes (every 2 s).")] | UnsetType
    ) = UNSET
    watch_until: Annotated[Regex, _doc("Regex: the first matching line ends the watch.")] | UnsetType = UNSET
    watch_ignore_case: Annotated[bool, _doc("Match the watch regexes case-insensitively.")] | UnsetType = (
        UNSET
    )
    watch_until_action: (
        Annotated[str, _doc('"stop" (default) ends the command at the until line; "keep".')] | UnsetType
    ) = UNSET


class GetArgs(_Command, frozen=True, kw_only=True):
    offset_bytes: (
        Annotated[Bytes, _doc("Bytes to skip from the oldest retained (with pattern: matches).")] | UnsetType
    ) = UNSET
    limit_bytes: Annotated[Bytes, _doc("Bytes to return (with pattern: matches).")] | UnsetType = UNSET
    pattern: Annotated[Regex, _doc("Regex: only lines that match.")] | UnsetType = UNSET
    ignore_case: Annotated[bool, _doc("Match pattern case-insensitively.")] | UnsetType = UNSET


class WriteArgs(_Command, frozen=True, kw_only=True):
    input: Annotated[str, Meta(max_length=1 << 20, description="The bytes to type.")]


class CommandArgs(_Command, frozen=True, kw_only=True):
    """A tool that names one command and nothing else."""


class TerminateArgs(_Command, frozen=True, kw_only=True):
    remove: Annotated[bool, _doc("Also remove the record and its output.")] | UnsetType = UNSET


class ResizeArgs(_Command, frozen=True, kw_only=True):
    cols: Annotated[Size, _doc("Columns (positive integer).")]
    rows: Annotated[Size, _doc("Rows (positive integer).")]


class WatchArgs(_Command, frozen=True, kw_only=True):
    watch_filter: (
        Annotated[Regex, _doc("Regex: matching lines are recorded as watch pushes.")] | UnsetType
    ) = UNSET
    watch_until: Annotated[Regex, _doc("Regex: the first matching line ends the watch.")] | UnsetType = UNSET
    watch_ignore_case: Annotated[bool, _doc("Match case-insensitively.")] | UnsetType = UNSET
    watch_until_action: Annotated[str, _doc('"stop" (default) or "keep".')] | UnsetType = UNSET
    clear: Annotated[bool, _doc("Clear the watch.")] | UnsetType = UNSET


class AwaitArgs(_Command, frozen=True, kw_only=True):
    goal_id: Annotated[str, _doc("The goal to wake.")]
    until: (
        Annotated[Regex, _doc("Regex: wake at the first matching line instead of at exit.")] | UnsetType
    ) = UNSET
    ignore_case: Annotated[bool, _doc("Match until case-insensitively.")] | UnsetType = UNSET
