"""``loopd-es import-loopd DIR``: bring an existing opencode-loopd project's goals and commands into the log.

Reading and mapping run in a worker thread (two file reads, then pure work) before the store is opened,
so a corrupt project fails fast without creating a log. Warnings (a torn last ledger line, history that
could not be carried over) go to stderr; they never change the exit code. Every ledger line that did not
become an event is listed on stdout with its line number and reason (and recorded in ``import.completed``).
Commands loopd had running are listed as needing reconciliation; ``--reconcile`` settles them through the
command service's reconciler (``missing``, or ``timeout`` past their deadline; their awaits fire once).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio.to_thread

if TYPE_CHECKING:
    from ..importer import ImportPlan


def register(subparsers: Any) -> None:
    """Add ``import-loopd`` to the command tree."""
    from .options import add_project_argument

    p = subparsers.add_parser(
        "import-loopd",
        help="import an opencode-loopd project (state.json + events.ndjson) into the log",
        description="Read DIR/.opencode/loopd/state.json (versions 1-9) and events.ndjson (after its "
        "rotated segments events.ndjson.N, oldest first) and append the "
        "equivalent events: one goal-<id> stream per goal, one command-<id> stream per command, and an "
        "import-<id> stream recording what came from the ledger and what was synthesised from the snapshot. "
        "Importing the same unchanged project again appends nothing.",
    )
    add_project_argument(p)
    p.add_argument(
        "--dry-run", action="store_true", help="read and map everything, print the plan, write nothing"
    )
    p.add_argument(
        "--reconcile",
        action="store_true",
        help="after importing, settle the commands loopd had running (their process is not ours): mark them "
        "missing, or timeout past their deadline, and fire their awaits once",
    )
    p.set_defaults(handler=_import)


async def _import(args: argparse.Namespace) -> int:
    from ..errors import LogNotFoundError
    from ..importer import apply_plan, build_plan, survey_plan
    from ..log import open_store
    from ..text_safe import term_line
    from .main import store_url

    plan = await anyio.to_thread.run_sync(build_plan, Path(args.directory))
    for warning in plan.warnings:
        print(f"loopd-es: warning: {term_line(warning)}", file=sys.stderr)
    ledger = sum(b.from_ledger for b in plan.batches)
    version = f"state.json version {plan.source_version}" + (
        f" (read as version {plan.migrated_version})" if plan.migrated_version != plan.source_version else ""
    )
    shape = (
        f"{plan.goals} goal(s), {plan.commands} command(s), {plan.event_count} events "
        f"({ledger} from the ledger, {plan.event_count - 2 - ledger} synthesised from {version})"
    )
    url = store_url(args)
    if args.dry_run:
        try:  # what this log holds of the import already: a dry run says what a real one would do
            async with await open_store(url, create=False) as store:
                survey = await survey_plan(store, plan)
        except LogNotFoundError:
            survey = None
        if survey is not None and survey.appended_events == 0:
            print(f"{plan.directory} is already imported into {url} (stream {plan.stream}): nothing to add")
            return 0
        todo = set(survey.written) if survey is not None else {b.stream for b in plan.batches}
        if survey is not None and survey.already:
            print(
                f"would finish an interrupted import of {plan.directory} into {url}: {survey.appended_events} "
                f"events on {len(todo)} stream(s) ({len(survey.already)} streams are there)"
            )
        else:
            print(f"would import {plan.directory}: {shape} on stream {plan.stream}")
        for batch in plan.batches:
            if batch.stream in todo:
                print(f"  {batch.stream}: {len(batch.events)} events ({batch.from_ledger} from the ledger)")
        _report(plan)
        return 0
    settled: list[str] = []
    async with await open_store(url) as store:
        result = await apply_plan(store, plan)
        if plan.needs_reconcile:
            from ..clock import WALL
            from ..procs.paths import CommandPaths
            from ..procs.service import load_state, reconcile

            paths = CommandPaths(url)
            for command_id in plan.needs_reconcile:
                held = await load_state(store, command_id)
                # past its deadline, loopd's timer would have ended it: settled (timeout) even unasked
                if held is None or not (
                    args.reconcile or (held.deadline_at is not None and held.deadline_at <= WALL.now())
                ):
                    continue
                await reconcile(store, paths, only=command_id)
                now = await load_state(store, command_id)
                if now is not None and not now.running:
                    settled.append(command_id)
    if result.appended_events == 0:
        print(f"{plan.directory} is already imported into {url} (stream {plan.stream}): nothing to add")
    else:
        finished = (
            f", finishing an interrupted import ({len(result.already)} streams were there)"
            if result.already
            else ""
        )
        print(f"imported {plan.directory} into {url}: {shape} on stream {plan.stream}{finished}")
    _report(plan, settled)
    return 0


def _report(plan: ImportPlan, settled: list[str] | None = None) -> None:
    """The ledger lines and state.json fields left out (with reasons), and the commands to reconcile."""
    if plan.skipped:
        print(f"{len(plan.skipped)} ledger line(s) not imported:")
        for k in plan.skipped:
            where = f" at byte {k.offset}" if k.offset is not None else ""
            print(f"  line {k.line}{where}" + (f" ({k.type})" if k.type else "") + f": {k.reason}")
    if plan.dropped_fields:
        print(f"{len(plan.dropped_fields)} state.json field(s) not kept:")
        for d in plan.dropped_fields:
            times = f" (x{d.count})" if d.count > 1 else ""
            print(f"  {d.path}{times}: {d.reason}")
    pending = [c for c in plan.needs_reconcile if settled is None or c not in settled]
    if settled:
        print(f"settled {len(settled)} command(s) loopd had running: " + ", ".join(settled))
    if pending:
        print(
            f"{len(pending)} command(s) were running in loopd and need reconciliation "
            "(`loopd-es import-loopd --reconcile DIR` or `loopd-es cmd reconcile`): " + ", ".join(pending)
        )
