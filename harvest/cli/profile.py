"""`harvest profile`: measure decode steps of a real worker, fit the two-stage latency profile, write it.

On a CPU host the device is one partition (finetune runs between decode steps), so the profile is
solo-only plus, with --finetune, the finetune throughput. SM-partitioned co-run profiling on a GPU runs
through eval/gpu (no SGLang needed there).
"""

import argparse
import json
import random
import time
from pathlib import Path


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("profile", help="profile decode latency through a real worker; write a profile")
    parser.add_argument("--model-path", default=None, help="HF model dir (default: embedded SmolLM2-135M)")
    parser.add_argument("--out", required=True, help="profile JSON to write; samples go beside it")
    parser.add_argument("--finetune", default=None, help="LlamaFactory YAML whose throughput to record")
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--max-seq-len", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=7, help="timed decode steps per point (median kept)")
    parser.add_argument("--held-out", type=int, default=8, help="random held-out shapes to score the fit on")
    parser.add_argument("--passes", type=int, default=3,
                        help="separate visits of every point, shuffled; the sample is the median over visits")
    parser.add_argument("--port", type=int, default=30010)
    parser.add_argument("--admin-port", type=int, default=30110)
    parser.set_defaults(func=run)


def median_sample(samples):
    """The visit with the median latency (its seq_len stays the one measured with it)."""
    return sorted(samples, key=lambda s: s.latency_ms)[len(samples) // 2]


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import Progress

    from harvest.errors import HarvestError
    from harvest.models import resolve_model_path
    from harvest.native.cuda_driver import has_real_driver
    from harvest.profiler import DecodeProfiler
    from harvest.profiler.host_facts import cpu_model_name
    from harvest.worker_process import WorkerProcess
    from predictor.partition_grid import PartitionGrid
    from predictor.profile import Profile
    from predictor.samples import write_samples
    from predictor.sampling_plan import SamplingPlan

    if has_real_driver():
        raise HarvestError("live profiling covers CPU hosts; on a GPU use eval/gpu (green-context partitions)")
    console = Console()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    model_path = resolve_model_path(args.model_path)
    grid = PartitionGrid.from_name("cpu")
    max_kv_tokens = args.max_batch_size * (args.max_seq_len + 64)
    plan = SamplingPlan(grid, args.max_batch_size, args.max_seq_len, max_kv_tokens=max_kv_tokens,
                        num_repeats=args.repeats, num_held_out_per_partition=args.held_out)
    worker = WorkerProcess(
        ["--model-path", str(model_path), "--max-running-requests", str(args.max_batch_size),
         # PD decode reserves room to grow each running request (num_reserved_decode_tokens, 512) on top.
         "--max-total-tokens", str(max_kv_tokens + 512 * args.max_batch_size + 1024)],
        args.port, args.admin_port, out.with_suffix(".worker.log"),
    )
    started = time.perf_counter()
    with console.status("starting the worker ..."):
        worker.start()
    fit, held_out = [], []
    try:
        profiler = DecodeProfiler(worker.url, worker.admin_url, grid, args.repeats)
        points = plan.points()
        # A shared 2-core host drifts by 20-30% over seconds (same shape, measured minutes apart): every
        # point is visited in several passes, shuffled, so drift spreads over fit and held-out points
        # alike and the median over visits drops the disturbed ones. The largest shape runs first,
        # unrecorded, so allocator arenas and caches are warm before anything counts.
        visits = [p for p in points for _ in range(args.passes)]
        random.Random(0).shuffle(visits)
        largest = max(points, key=lambda p: p.batch_size * p.seq_len)
        with console.status("warming up on the largest shape ..."):
            profiler.measure(largest)
        measured: dict = {p: [] for p in points}
        measure_started = time.perf_counter()
        with Progress(console=console) as progress:
            task = progress.add_task("decode shapes", total=len(visits))
            for point in visits:
                measured[point].append(profiler.measure(point))
                progress.advance(task)
        measure_s = time.perf_counter() - measure_started
        for point in points:
            (held_out if point.is_held_out else fit).append(median_sample(measured[point]))
    finally:
        worker.stop()
    samples_path = out.with_suffix(".samples.csv")
    held_out_path = out.with_suffix(".held_out.csv")
    write_samples(samples_path, fit)
    write_samples(held_out_path, held_out)
    profile = Profile.build(fit, grid, device_name=cpu_model_name(), model=str(model_path),
                            finetune_config_id=Path(args.finetune).name if args.finetune else "none",
                            samples_path=samples_path, held_out=held_out)
    profile.save(out)
    summary = {
        "profile": str(out),
        "num_fit_samples": len(fit),
        "num_held_out_samples": len(held_out),
        "measure_s": round(measure_s, 1),
        "total_s": round(time.perf_counter() - started, 1),
        "fit_metrics": profile.to_dict()["fit_metrics"],
    }
    print(json.dumps(summary))
    return 0
