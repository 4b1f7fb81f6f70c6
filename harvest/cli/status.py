"""`harvest status --admin URL [--admin URL ...]`: a running worker's stats as tables; with several workers (a
fleet's decode workers), one row per worker side by side.

Deferred imports: the machinery is imported in `run()`, since `harvest --help` imports every subcommand module.
"""

import argparse
import json

import httpx
from rich.console import Console
from rich.table import Table

from base.errors import HarvestError
from harvest.bench.metric_table import print_table

FLEET_COLUMNS = ("replica_id", "round", "members", "tokens_contributed", "staleness", "sync_ms_total")


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("status", help="print a running worker's stats (several: a fleet view)")
    parser.add_argument("--admin", action="append", default=None,
                        help="admin URL of the worker (default http://127.0.0.1:30100); repeat for each worker of a "
                        "fleet")
    parser.add_argument("--json", action="store_true", help="print the raw JSON instead of tables")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harvest.worker.client import read_stats

    urls = [url.rstrip("/") for url in args.admin or ["http://127.0.0.1:30100"]]
    stats = {}
    for url in urls:
        try:
            stats[url] = read_stats(url)
        except httpx.HTTPError as e:
            raise HarvestError(f"cannot read stats from {url}: {e}") from None
    if args.json:
        print(json.dumps(stats[urls[0]] if len(urls) == 1 else stats, indent=2))
    elif len(urls) == 1:
        print_stats_table(stats[urls[0]])
    else:
        print_fleet_table(stats)
    return 0


def print_stats_table(stats: dict, console: Console | None = None) -> None:
    """`/harvest/stats` as one table per section."""
    console = console or Console()
    for section, values in stats.items():
        print_table(f"harvest {section}", values, console)


def fleet_rows(stats_by_url: dict[str, dict]) -> list[dict]:
    """A worker a row: its fleet membership, the adapter version it serves, its decode steps in target."""
    rows = []
    for url, stats in stats_by_url.items():
        finetune = stats.get("finetune") or {}
        fleet = finetune.get("fleet") or {}
        published = finetune.get("published") or {}
        slo = (stats.get("colocation") or {}).get("slo") or {}
        rows.append({"admin": url, **{k: fleet.get(k) for k in FLEET_COLUMNS},
                     "serves_round": published.get("fleet_round"), "job": finetune.get("state"),
                     "steps_in_target": slo.get("attainment_window"),
                     "adapter_checksum": fleet.get("adapter_checksum")})
    return rows


def print_fleet_table(stats_by_url: dict[str, dict], console: Console | None = None) -> None:
    rows = fleet_rows(stats_by_url)
    checksums = {str(r["adapter_checksum"]) for r in rows if r["adapter_checksum"] is not None}
    table = Table(title=f"harvest fleet: {len(rows)} workers, "
                  f"{'one adapter' if len(checksums) <= 1 else f'{len(checksums)} different adapters'}",
                  title_justify="left")
    columns = [c for c in rows[0] if c != "adapter_checksum"]
    for column in columns:
        table.add_column(column, justify="left" if column in ("admin", "replica_id", "job") else "right")
    for row in rows:
        table.add_row(*("-" if row[c] is None else f"{row[c]:.4g}" if isinstance(row[c], float) else str(row[c])
                        for c in columns))
    (console or Console()).print(table)
