"""`harvest bench fleet`: a fleet of two decode workers training one adapter against one worker alone, live, on
the same trace window.

- one worker: `harvest serve` with the job on the whole host, replaying the whole window;
- fleet of 2: a torchft lighthouse and two `harvest serve --fleet` workers, each pinned to its half of the
  cores and training its half of the dataset, each replaying every other request of the window (a round-robin
  router's share), side by side.
Finetune tokens are the jobs' own counts (admin stats) over the replay's wall time, summed over the fleet; steps
in target are each worker's own step records, the fleet's the lower of its two. Rows alternate order between
repeats; a row run twice is the A/A control.

Deferred imports: each bench imports its machinery (torch, SGLang, the replay) when it runs, not when `harvest bench`
lists it.
"""

import argparse
import datetime
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml
from rich.table import Table

from base.errors import HarvestError
from harvest.bench import device_name
from harvest.bench.colocate import (
    bench_job,
    bench_worker,
    load_window,
    parse_window,
    wait_job_steps,
)
from harvest.bench.flags import add_replay_arguments, add_worker_arguments
from harvest.bench.trainer_process import cpu_halves
from harvest.deploy.fleet_lighthouse import lighthouse_process, start_lighthouse
from harvest.models import resolve_model_path
from harvest.worker.client import read_stats
from harvest.worker.process import free_ports

ROWS = {"one-worker": "one worker (all cores)", "fleet-2": "fleet of 2 (half the cores each)"}
FLEET_SIZE = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--window", default="steady=conv:17s+12s", metavar="NAME=TRACE:START+LENGTH",
                        help="the trace window every row replays (default steady=conv:17s+12s)")
    parser.add_argument("--rate-scale", type=float, default=0.1, help="replay rate scale (default 0.1)")
    add_worker_arguments(parser, log_dir="runs/bench-fleet")
    add_replay_arguments(parser)
    parser.add_argument("--round-s", type=float, default=2.0, help="the fleet's round period (default 2 s)")
    parser.add_argument("--repeats", type=int, default=2, help="repeats; odd ones reverse the row order")
    parser.add_argument("--job", default=None, help="LlamaFactory YAML (default: the demo job)")
    parser.add_argument("--warmup-steps", type=int, default=1)
    parser.add_argument("--dtype", default="auto", help="every worker's serving dtype (SGLang flag)")


def run(args: argparse.Namespace) -> dict:
    if args.repeats < 1 or args.warmup_steps < 1 or not args.round_s > 0:
        raise HarvestError("--repeats and --warmup-steps must be >= 1, --round-s > 0")
    if len(cpu_halves()[1]) == 0:
        raise HarvestError("bench fleet pins each worker to half the cores: this host has one core")
    name, spec = parse_window(args.window)
    trace = load_window(spec, args.rate_scale, args)
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    model_path = str(resolve_model_path(args.model_path))
    job = bench_job(args.job, model_path, log_dir)
    load_start, started, runs = os.getloadavg()[0], time.perf_counter(), []
    for repeat in range(args.repeats):
        for row in (ROWS if repeat % 2 == 0 else list(ROWS)[::-1]):
            print(f"bench fleet: repeat {repeat}: {ROWS[row]}", file=sys.stderr)
            run_dir = log_dir / f"{repeat}-{row}"
            measure = _one_worker if row == "one-worker" else _fleet
            runs.append({"repeat": repeat, "row": row, **measure(trace, job, model_path, run_dir, args)})
    table = {row: _summary([r for r in runs if r["row"] == row]) for row in ROWS}
    one, fleet = table["one-worker"]["finetune_tokens_per_s"], table["fleet-2"]["finetune_tokens_per_s"]
    return {
        "table": table,
        "fleet_over_one_worker": None if not one or fleet is None else round(fleet / one, 3),
        "runs": runs,
        "window": {"name": name, "spec": spec, "rate_scale": args.rate_scale, **trace.summary()},
        "config": {"tpot_slo_ms": args.tpot_ms, "round_s": args.round_s, "concurrency": args.concurrency,
                   "repeats": args.repeats, "dtype": args.dtype, "job": job},
        "device": device_name(is_cpu_host=True),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "wall_s": round(time.perf_counter() - started, 1),
        "load_avg_1m_start": round(load_start, 2),
        "load_avg_1m_end": round(os.getloadavg()[0], 2),
    }


def _serve_flags(job: dict, job_dir: Path, model_path: str, args: argparse.Namespace) -> list[str]:
    job_dir.mkdir(parents=True, exist_ok=True)
    job_path = job_dir / "job.yaml"
    job_path.write_text(yaml.safe_dump({**job, "output_dir": str((job_dir / "adapter").resolve())}))
    return ["--model-path", model_path, "--max-total-tokens", str(args.max_total_tokens), "--dtype", args.dtype,
            "--finetune", str(job_path), "--tpot-slo-ms", str(args.tpot_ms)]


def _one_worker(trace, job: dict, model_path: str, run_dir: Path, args: argparse.Namespace) -> dict:
    worker = bench_worker(tuple(_serve_flags(job, run_dir, model_path, args)), run_dir, None)
    try:
        worker.start(args.start_timeout_s)
        wait_job_steps(worker.admin_url, args.warmup_steps, args.start_timeout_s)
        measured = _replay(worker, trace, args)
    finally:
        worker.stop()
    return {"finetune_tokens_per_s": round(measured["tokens"] / measured["replay_s"], 2),
            "steps_within_target": measured["steps_within_target"], "workers": [measured]}


def _lighthouse(run_dir: Path):
    """The fleet's lighthouse as `harvest deploy` runs it (its log in the run's folder), and its URL once it
    answers."""
    (port,) = free_ports(1)
    run_dir.mkdir(parents=True, exist_ok=True)
    lighthouse = lighthouse_process("127.0.0.1", port, run_dir / "lighthouse.log", join_timeout_ms=1000)
    try:
        start_lighthouse(lighthouse, port, 30.0)
    except HarvestError:
        lighthouse.stop()
        raise
    return lighthouse, f"http://127.0.0.1:{port}"


def _fleet(trace, job: dict, model_path: str, run_dir: Path, args: argparse.Namespace) -> dict:
    lighthouse, url = _lighthouse(run_dir)
    workers = []
    try:
        for index, cpus in enumerate(cpu_halves()):
            flags = [*_serve_flags(job, run_dir / f"w{index}", model_path, args), "--fleet", url,
                     "--replica-id", f"w{index}", "--fleet-shard", f"{index}/{FLEET_SIZE}",
                     "--fleet-round-s", str(args.round_s)]
            workers.append(bench_worker(tuple(flags), run_dir / f"w{index}", tuple(cpus)))
        for worker in workers:  # one after the other: the first forms the fleet, the second joins it
            worker.start(args.start_timeout_s)
        for worker in workers:
            wait_job_steps(worker.admin_url, args.warmup_steps, args.start_timeout_s)
        with ThreadPoolExecutor(FLEET_SIZE) as pool:
            measured = list(pool.map(lambda i: _replay(workers[i], trace.round_robin(FLEET_SIZE, i), args),
                                     range(FLEET_SIZE)))
    finally:
        for worker in workers:
            worker.stop()
        lighthouse.stop()
    replay_s = max(m["replay_s"] for m in measured)
    return {"finetune_tokens_per_s": round(sum(m["tokens"] for m in measured) / replay_s, 2),
            "steps_within_target": min(m["steps_within_target"] for m in measured), "workers": measured}


def _replay(worker, trace, args: argparse.Namespace) -> dict:
    from harvest.replay.live_replay import LiveReplay

    before = read_stats(worker.admin_url)["finetune"]
    results = LiveReplay(worker.url, worker.admin_url, args.tpot_ms, args.concurrency, drain_s=args.drain_s).run(trace)
    after = read_stats(worker.admin_url)["finetune"]
    decode = results["policies"]["live"]["decode"]
    fleet_before, fleet_after = before.get("fleet") or {}, after.get("fleet") or {}
    return {"admin": worker.admin_url, "tokens": after["tokens"] - before["tokens"], "replay_s": results["replay_s"],
            "steps_within_target": decode["step_slo_attainment"], "num_steps": decode["num_steps"],
            "num_requests": decode["num_requests"], "num_failed_requests": decode["num_failed_requests"],
            "tpot_ms_p50": decode["tpot_ms_p50"],
            "rounds": fleet_after.get("round", 0) - fleet_before.get("round", 0) if fleet_after else None,
            "sync_ms": (round(fleet_after["sync_ms_total"] - fleet_before.get("sync_ms_total", 0.0), 1)
                        if fleet_after else None),
            "members_last_round": fleet_after.get("members"), "worker_log": str(worker.log_path)}


def _summary(runs: list[dict]) -> dict:
    rates = [r["finetune_tokens_per_s"] for r in runs]
    return {"finetune_tokens_per_s": round(statistics.median(rates), 2), "runs_tokens_per_s": rates,
            "steps_within_target": min(r["steps_within_target"] for r in runs), "num_runs": len(runs)}


def print_result(result: dict, console) -> None:
    table = Table(title="harvest bench fleet", title_justify="left")
    for column in ("row", "finetune tok/s (median)", "each run", "steps in target (lowest)", "runs"):
        table.add_column(column, justify="left" if column == "row" else "right")
    for row, entry in result["table"].items():
        table.add_row(ROWS[row], f"{entry['finetune_tokens_per_s']:.1f}",
                      ", ".join(f"{r:.1f}" for r in entry["runs_tokens_per_s"]),
                      f"{100 * entry['steps_within_target']:.1f} %", str(entry["num_runs"]))
    console.print(table)
    console.print(f"fleet of 2 over one worker: x{result['fleet_over_one_worker']} finetune tokens/s")
