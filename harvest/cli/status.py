"""`harvest status --admin URL`: a running worker's stats as tables."""

import argparse

import httpx
from rich.console import Console

from base.errors import HarvestError
from harvest.bench.metric_table import print_table


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("status", help="print a running worker's stats")
    parser.add_argument("--admin", default="http://127.0.0.1:30100", help="admin URL of the worker")
    parser.add_argument("--json", action="store_true", help="print the raw JSON instead of tables")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harvest.worker.client import read_stats

    try:
        stats = read_stats(args.admin.rstrip("/"))
    except httpx.HTTPError as e:
        raise HarvestError(f"cannot read stats from {args.admin}: {e}") from None
    if args.json:
        import json

        print(json.dumps(stats, indent=2))
    else:
        print_stats_table(stats)
    return 0


def print_stats_table(stats: dict, console: Console | None = None) -> None:
    """`/harvest/stats` as one table per section."""
    console = console or Console()
    for section, values in stats.items():
        print_table(f"harvest {section}", values, console)
