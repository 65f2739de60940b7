"""``loopd-es opencode install [DIR]``: give the agents inside OpenCode the reference's tools.

It writes one custom tool per worker and owner tool into ``DIR/.opencode/tool/`` and the engine's socket and a
fresh token into ``DIR/.opencode/loopd/engine.json`` (mode 0600, listed in that folder's ``.gitignore``).
``loopd-es run --host opencode:URL`` started in ``DIR`` then serves those tools on that Unix socket, in a
directory only this user can enter (``--tool-api`` names another file).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import EXIT_OK, UsageError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``opencode install`` to the ``loopd-es`` parser."""
    p = sub.add_parser(
        "opencode",
        help="set up an OpenCode project for loopd-es (custom tools)",
        description="Prepare a directory for `loopd-es run --host opencode:...`: its workers and owners then "
        "reach the engine through OpenCode custom tools.",
    )
    verbs = p.add_subparsers(dest="verb", required=True, metavar="ACTION")
    v = verbs.add_parser(
        "install",
        help="write the loopd tools into DIR/.opencode/tool and the engine's socket",
        description="Write one OpenCode custom tool per loopd tool (get_goal, report_goal_progress, complete_goal, "
        "block_goal for workers; loopd_create_goal, pause_goal, resume_goal, ... and the loopd_command_* command "
        "tools for owners) and "
        "DIR/.opencode/loopd/engine.json with the engine's socket and a new token (kept out of git by "
        "DIR/.opencode/loopd/.gitignore). Then start `loopd-es run --host opencode:http://127.0.0.1:PORT` in DIR.",
    )
    v.add_argument(
        "directory", nargs="?", default=".", metavar="DIR", help="the OpenCode project (default: .)"
    )
    v.set_defaults(handler=_install)


async def _install(args: argparse.Namespace) -> int:
    import anyio.to_thread

    return await anyio.to_thread.run_sync(_install_files, args)


def _install_files(args: argparse.Namespace) -> int:
    from ..engine.opencode_tools import install
    from ..engine.tool_api import OWNER_TOOLS, WORKER_TOOLS, ToolApiConfig

    project = Path(args.directory)
    if not project.is_dir():
        raise UsageError(f"{project} is not a directory: name the OpenCode project to install into")
    written = install(project, ToolApiConfig.new(project), [*WORKER_TOOLS, *OWNER_TOOLS])
    tools = len(written) - 1
    print(f"wrote {tools} tools to {project / '.opencode' / 'tool'} and the engine's socket to {written[-1]}")
    print(
        f"next: cd {project} && loopd-es run --host opencode:http://127.0.0.1:4096   (OpenCode's address)",
        file=sys.stderr,
    )
    return EXIT_OK
