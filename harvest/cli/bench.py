"""`harvest bench NAME`: run one benchmark, print its result as one JSON object, then as a table.

A benchmark module defines `add_arguments(parser)` and `run(args) -> dict` (flat or one level nested), and
may define `print_result(result, console)` where a metric/value table does not fit its result.
"""

import argparse
import importlib
import json

from rich.console import Console

from harvest.bench.metric_table import print_table

BENCH_MODULES = {
    "predictor": "predictor.bench",
    "allocator": "harvest.bench.allocator",
    "finetune": "harvest.finetune.bench",
    "serve": "harvest.bench.serve",
    "pd": "harvest.deploy.bench_pd",
    "colocate": "harvest.bench.colocate",
    "fleet": "harvest.bench.fleet",
    "slo": "harvest.bench.slo",
    "units": "harvest.bench.units",
    "warmup": "harvest.bench.warmup",
}


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("bench", help="run a benchmark; prints JSON and a table")
    names = parser.add_subparsers(dest="bench", metavar="NAME", required=True)
    for name, module_name in BENCH_MODULES.items():
        sub = names.add_parser(name, help=f"benchmark {name}")
        sub.set_defaults(func=run, bench_module=module_name)
        try:
            importlib.import_module(module_name).add_arguments(sub)
        except ModuleNotFoundError as e:
            if e.name != module_name:
                raise


def run(args: argparse.Namespace) -> int:
    module = importlib.import_module(args.bench_module)
    result = module.run(args)
    print(json.dumps(result))
    if hasattr(module, "print_result"):
        module.print_result(result, Console(stderr=True))
    else:
        print_table(f"harvest bench {args.bench}", result, Console(stderr=True))
    return 0
