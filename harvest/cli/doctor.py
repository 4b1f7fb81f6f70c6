"""`harvest doctor [--json] [--only NAME,...]`: the checks of harvest/doctor/, one JSON line each, then a table.

Deferred imports: the machinery is imported in `run()`, since `harvest --help` imports every subcommand module.
"""

import argparse
import json
import sys

from base.errors import HarvestError


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("doctor", help="check this host's CPU and GPU paths against expected values")
    parser.add_argument("--json", action="store_true", help="only the JSON lines, no table")
    parser.add_argument("--only", default="", help="comma-separated check names to run (default: all)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harvest.doctor.check import FAIL
    from harvest.doctor.runner import CHECKS, gpu_skip_reason, run_checks

    names = [n for n in args.only.split(",") if n]
    unknown = sorted(set(names) - {c.name for c in CHECKS})
    if unknown:
        raise HarvestError(f"unknown check(s) {', '.join(unknown)}; known: {', '.join(c.name for c in CHECKS)}")
    checks = [c for c in CHECKS if not names or c.name in names]
    results = run_checks(checks, lambda r: print(json.dumps(r.as_dict(), default=str), flush=True),
                         skip_gpu=gpu_skip_reason())
    if not args.json:
        _print_table(results)
    return 1 if any(r.status == FAIL for r in results) else 0


def _print_table(results) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="harvest doctor", title_justify="left", show_lines=True)
    for column in ("#", "check", "status", "measured", "expected", "if different"):
        table.add_column(column, overflow="fold")
    for index, result in enumerate(results, 1):
        measured = ", ".join(f"{k}={v}" for k, v in result.values.items())
        table.add_row(str(index), result.check, result.status, measured, result.expected,
                      "" if result.status in ("PASS", "SKIP") else result.if_different)
    Console(file=sys.stderr, width=200).print(table)
