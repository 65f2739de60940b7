"""A goal's configuration under the reference's names (``maxFailures``, ``scheduleEveryMs`` ...).

``loopd_create_goal``'s reply, ``goal show`` and ``goals --json`` show the options this way, so what a caller
passed reads back under the same name. Absent options are ``None``: the decider's default applies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..events.goal import GoalConfig


def config_options(cfg: GoalConfig) -> dict[str, Any]:
    """Every option of ``cfg`` keyed by its ``loopd_create_goal`` field, plus ``artifactDir``."""
    schedule = cfg.schedule
    return {
        "model": cfg.model,
        "agent": cfg.agent,
        "fallbackModels": list(cfg.fallback_models),
        "checks": list(cfg.checks),
        "checkCwd": cfg.check_cwd,
        "workspaceWrite": cfg.workspace_write,
        "progressFile": cfg.progress_file,
        "costBudget": cfg.cost_budget,
        "tokenBudget": cfg.token_budget,
        "maxTurns": cfg.max_turns,
        "maxNoProgress": cfg.max_no_progress,
        "maxFailures": cfg.max_failures,
        "maxEvaluatorRejections": cfg.max_evaluator_rejections,
        "compactEvery": cfg.compact_every,
        "timeoutMs": cfg.timeout_ms,
        "scheduleEveryMs": schedule.every_ms if schedule else None,
        "scheduleMaxRuns": schedule.max_runs if schedule else None,
        "interactive": cfg.interactive,
        "artifactDir": cfg.artifact_dir,
    }
