"""Print the Markdown tables ``docs/performance.md`` quotes, from one ``tools/bench_all.py`` run file.

    python tools/bench_report.py docs/bench/20261203T103000Z-1c9512a0-full.json

The issue-26 rows (loopd-es, its peer, the ratio, the target) and, for every benchmark, its wall time and the
load average before and after it, so a reader can check each figure against the file it comes from.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def report(record: dict[str, Any], name: str) -> str:
    m = record["machine"]
    lines = [
        f"Run `{name}`: {record['mode']} mode, started {record['started']}, commit `{record['commit'][:8]}`"
        f"{' (with uncommitted changes)' if record['tree_changed'] else ''}, {record['seconds']:.0f} s.",
        f"Machine: {m['cpu']}, {m['cpus']} CPUs, {m['memory_gb']} GB, Python {m['python']}, SQLite {m['sqlite']},"
        f" eventsourcing {m['eventsourcing']}. Load average (1, 5, 15 min) before {record['load_before']},"
        f" after {record['load_after']}.",
        "",
        "| work | loopd-es | peer | ratio | target | met |",
        "|---|---|---|---|---|---|",
    ]
    for row in record["summary"]:
        if "error" in row:
            lines.append(f"| {row['work']} | - | - | - | - | {row['error']} |")
            continue
        met = {True: "yes", False: "**no**", None: "-"}[row["pass"]]
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:g}x"
        lines.append(
            f"| {row['work']} | {row['loopd_es']} | {row['peer']} | {ratio} | {row['target']} | {met} |"
        )
    lines += ["", "| benchmark | seconds | load before | load after | note |", "|---|---|---|---|---|"]
    for bench, run in record["benchmarks"].items():
        note = run.get("skipped") or run.get("error") or ""
        lines.append(
            f"| {bench} | {run.get('seconds', '-')} | {run.get('load_before', '-')} |"
            f" {run.get('load_after', '-')} | {str(note).replace('|', '/')} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path, help="a JSON file written by tools/bench_all.py")
    args = parser.parse_args(argv)
    print(report(json.loads(args.file.read_text()), args.file.name))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
