"""`harvest profile`: measure decode steps of a real worker, fit the two-stage latency profile, write it.

On the host's device (harvest/profiler/live_profile.py): its GPU where a CUDA driver is, else its CPU.
`--co-run` profiles the device's partitions too: SM partitions on green contexts on a GPU, core sets on a CPU.

Deferred imports: the machinery is imported in `run()`, since `harvest --help` imports every subcommand module.
"""

import argparse
import dataclasses
import json

from harvest.profiler.live_profile import VISIT_STATISTICS, LiveProfileConfig


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("profile", help="profile decode latency through a real worker; write a profile")
    parser.add_argument("--model-path", default=None, help="HF model dir (default: embedded SmolLM2-135M)")
    parser.add_argument("--out", required=True, help="profile JSON to write; samples go beside it")
    parser.add_argument("--finetune", default=None,
                        help="LlamaFactory YAML whose solo throughput to measure and record (after the decode steps)")
    parser.add_argument("--finetune-steps", type=int, default=3, help="timed optimizer steps, after one warm-up")
    parser.add_argument("--finetune-max-unit-ms", type=float, default=None,
                        help="split units as `harvest serve` would at this bound (default: whole micro-batch units)")
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--max-seq-len", type=int, default=1024)
    parser.add_argument("--seq-levels", type=int, default=3, help="evenly spaced seq_len levels per batch size")
    parser.add_argument("--repeats", type=int, default=3, help="timed decode steps per visit (median kept)")
    parser.add_argument("--held-out", type=int, default=12,
                        help="random held-out shapes inside the fitted range to score the fit on")
    parser.add_argument("--passes", type=int, default=5, help="separate visits of every point, shuffled")
    parser.add_argument("--max-foreign-cores", type=float, default=0.1,
                        help="a visit during which other processes used more cores than this is measured again later")
    parser.add_argument("--max-revisits", type=int, default=2,
                        help="disturbed visits re-queued per point before a disturbed one is kept (in all, at "
                        "most half as many as there are visits: a busy host costs at most 1.5x the time)")
    parser.add_argument("--statistic", choices=sorted(VISIT_STATISTICS), default="min",
                        help="which of a point's kept visits is its sample: min, the least disturbed (default), "
                        "or median")
    parser.add_argument("--dtype", default="auto",
                        help="the worker's serving dtype (SGLang flag; serve with the one profiled: float32 on a CPU "
                        "for a job that computes on the served weights)")
    parser.add_argument("--co-run", action="store_true",
                        help="profile the device's partitions too (needs --finetune): decode pinned to some SMs (a "
                        "CPU's cores) with the job co-running on others; the profile then makes `harvest serve "
                        "--profile` spatial")
    parser.add_argument("--port", type=int, default=30010)
    parser.add_argument("--admin-port", type=int, default=30110)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from harvest.profiler.live_profile import run_live_profile

    config = LiveProfileConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(LiveProfileConfig)})
    print(json.dumps(run_live_profile(config, Console(stderr=True))))
    return 0
