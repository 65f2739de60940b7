"""Running a goal's completion checks as real shell commands (docs/reference/loopd.md#s3-16
``complete_goal``).

Sequentially, each with a 30 s timeout, in ``checkCwd || artifactDir || directory``; a failure keeps its exit
code (1 when the shell gave none, e.g. after the timeout killed it) and the first 1000 characters of stdout
and stderr.
"""

from __future__ import annotations

import os
from typing import Final

import anyio

from ..domain.goal_commands import CheckResult

CHECK_TIMEOUT_S: Final = 30.0
OUTPUT_CHARS: Final = 1000


async def run_checks(
    checks: tuple[str, ...], cwd: str, *, limit_s: float = CHECK_TIMEOUT_S
) -> list[CheckResult]:
    """Every check's result, in order (all of them run, as the reference does)."""
    return [await run_check(command, cwd, limit_s=limit_s) for command in checks]


async def run_check(command: str, cwd: str, *, limit_s: float = CHECK_TIMEOUT_S) -> CheckResult:
    if not await anyio.Path(cwd).is_dir():
        return CheckResult(command=command, exit_code=1, stderr=f"working directory {cwd} does not exist")
    stdout = stderr = b""
    code: int | None = None
    async with await anyio.open_process(command, cwd=cwd, env=dict(os.environ)) as process:
        timed_out = True
        with anyio.move_on_after(limit_s):
            async with anyio.create_task_group() as tg:

                async def read_out() -> None:
                    nonlocal stdout
                    assert process.stdout is not None
                    async for chunk in process.stdout:
                        stdout = (stdout + chunk)[-64 * 1024 :]

                async def read_err() -> None:
                    nonlocal stderr
                    assert process.stderr is not None
                    async for chunk in process.stderr:
                        stderr = (stderr + chunk)[-64 * 1024 :]

                tg.start_soon(read_out)
                tg.start_soon(read_err)
            code = await process.wait()
            timed_out = False
        if timed_out:
            process.kill()
            await process.wait()
            stderr += f"\n[timed out after {limit_s:g} s]".encode()
            code = 1
    return CheckResult(
        command=command,
        exit_code=code if code is not None else 1,
        stdout=stdout.decode(errors="replace")[:OUTPUT_CHARS] or None,
        stderr=stderr.decode(errors="replace")[:OUTPUT_CHARS] or None,
    )
