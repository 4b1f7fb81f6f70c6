"""`harvest bench slo`: steps in target with the LoRA job inside the worker, against decode alone, live.

Two workers in turn, each with the same job (the demo data), replay the same window of a trace:
- decode alone: the job built, holding its lent KV memory, paused, so harvest's fixed cost on a step is in
  both rows and the second row measures only what the controller decides;
- harvest: the job running, publishing its adapter every `--publish-every-steps` optimizer steps if set.
The target is `--target-over-p99` x decode alone's 99th-percentile step. A step counts what its requests
waited for: decode + the finetune slice after it + an idle-time unit or adapter load it waited for. Every
step past the target is given its cause (`harvest.step_stats.miss_cause`): decode alone, or one part of the
job's time. The window's rate is scaled by how much slower this host decodes one request than the hosts
the default rate was set on (`--reference-step-ms`), so the bench poses the same problem on a slow host.

Deferred imports: each bench imports its machinery (torch, SGLang, the replay) when it runs, not when `harvest bench`
lists it.
"""

import argparse
import datetime
import json
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import yaml
from rich.table import Table

from base.errors import HarvestError
from harvest.bench import device_name
from harvest.bench.flags import add_replay_arguments, add_worker_arguments
from harvest.models import resolve_model_path
from harvest.step_stats import MISS_CAUSES, miss_cause
from harvest.worker.client import read_last_step_seq, read_stats, read_steps_since, wait_for_stats
from harvest.worker.process import WorkerProcess, free_ports

JOB_WAIT_S = 600.0
ALONE_TARGET_MS = 1000.0
"""The decode-alone worker's target until its job is paused: any finite one. A slice fills what the target leaves
of a step, so with none (1e9) a step before the pause would train for days and the worker never answer /health."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_worker_arguments(parser, log_dir="runs/bench-slo")
    add_replay_arguments(parser, with_target=False)
    parser.set_defaults(max_generated_tokens=48, concurrency=16)
    parser.add_argument("--trace", default="conv", help="trace name (default conv)")
    parser.add_argument("--window-start-s", type=float, default=600.0)
    parser.add_argument("--window-s", type=float, default=90.0, help="seconds of the replay (default 90)")
    parser.add_argument("--rate-scale", type=float, default=0.1, help="the trace's rate scale on a reference host")
    parser.add_argument("--reference-step-ms", type=float, default=30.0,
                        help="the batch-1 decode step (median) of the hosts --rate-scale was set on; a slower "
                             "host replays at a rate scaled down by as much (0: no scaling)")
    parser.add_argument("--target-over-p99", type=float, default=1.5,
                        help="the TPOT target as a multiple of decode alone's p99 step (default 1.5)")
    parser.add_argument("--epoch-samples", type=int, default=8,
                        help="samples the job trains on, so the loss is compared over the same ones (default 8)")
    parser.add_argument("--publish-every-steps", type=int, default=0,
                        help="the job publishes its adapter into the worker every N optimizer steps (0: never)")


def run(args: argparse.Namespace) -> dict:
    import torch


    if args.window_s <= 0 or args.rate_scale <= 0 or args.target_over_p99 <= 1.0:
        raise HarvestError("--window-s and --rate-scale must be > 0 and --target-over-p99 > 1")
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    model_path = str(resolve_model_path(args.model_path))
    job_path = _write_job(log_dir, model_path, args)
    started = time.perf_counter()

    with _worker(args, model_path, job_path, log_dir, "decode-alone", tpot_slo_ms=ALONE_TARGET_MS) as alone:
        _wait_for_job(alone, "running")
        if _admin_post(alone, "/harvest/finetune/pause")["state"] != "paused":
            raise HarvestError("the decode-alone worker's job did not pause")
        step_ms = _batch_one_step_ms(alone, args)
        scale = 1.0 if args.reference_step_ms <= 0 else min(1.0, args.reference_step_ms / step_ms)
        rate_scale = args.rate_scale * scale
        alone_steps = _replay(alone, args, rate_scale, tpot_slo_ms=1e9)
        if read_stats(alone.admin_url)["finetune"]["state"] != "paused":
            raise HarvestError("the decode-alone worker's job resumed during the replay")
    alone_p99_ms = float(np.percentile([s["latency_ms"] for s in alone_steps], 99))
    tpot_slo_ms = round(args.target_over_p99 * alone_p99_ms, 1)

    with _worker(args, model_path, job_path, log_dir, "harvest", tpot_slo_ms=tpot_slo_ms) as worker:
        _wait_for_job(worker, "running")
        before = read_stats(worker.admin_url)["finetune"]
        replay_started = time.perf_counter()
        steps = _replay(worker, args, rate_scale, tpot_slo_ms)
        replay_s = time.perf_counter() - replay_started
        stats = read_stats(worker.admin_url)
        published = _wait_published(worker, stats["finetune"]["step"], args.publish_every_steps)
    (log_dir / "steps.json").write_text(json.dumps({"decode_alone": alone_steps, "harvest": steps}))

    alone_row = _row(alone_steps, tpot_slo_ms)
    harvest_row = _row(steps, tpot_slo_ms)
    log = log_dir / "harvest" / "adapter" / "finetune_log.jsonl"
    losses = [json.loads(line)["loss"] for line in log.open()] if log.exists() else []
    epoch_steps = max(1, args.epoch_samples // 2)  # per_device_train_batch_size 2
    # The job's own count over the replay: units in slices, beside decode and in idle time alike.
    finetune_tokens = stats["finetune"]["tokens"] - before.get("tokens", 0)
    harvest_row |= {
        "optimizer_steps": stats["finetune"]["step"] - before.get("step", 0),
        "finetune_tokens": finetune_tokens,
        "finetune_tokens_in_steps": sum(s["finetune_tokens"] for s in steps),
        "finetune_tokens_per_s": round(finetune_tokens / replay_s, 2),
        "replay_s": round(replay_s, 1),
        "loss_first_epoch": round(float(np.mean(losses[:epoch_steps])), 4) if losses else None,
        "loss_last_epoch": round(float(np.mean(losses[-epoch_steps:])), 4) if losses else None,
        "chunks_lent": stats["memory"].get("chunks_lent"),
        "published": published,
    }
    return {
        "verdict": _verdict(alone_row, harvest_row),
        "tpot_slo_ms": tpot_slo_ms,
        "decode_alone_p99_ms": round(alone_p99_ms, 2),
        "batch_one_step_ms": round(step_ms, 2),
        "rate_scale": round(rate_scale, 5),
        "decode_alone": alone_row,
        "harvest": harvest_row,
        "colocation": stats["colocation"],
        "device": device_name(not torch.cuda.is_available()),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "wall_s": round(time.perf_counter() - started, 1),
        "steps_file": str(log_dir / "steps.json"),
    }


def _row(steps: list[dict], tpot_slo_ms: float) -> dict:
    causes = Counter(miss_cause(s, tpot_slo_ms) for s in steps)
    return {
        "num_steps": len(steps),
        "steps_within_target": round(causes[None] / len(steps), 5) if steps else None,
        "misses_by_cause": {cause: causes[cause] for cause in MISS_CAUSES},
        "step_ms_p50": round(float(np.percentile([s["latency_ms"] for s in steps], 50)), 2) if steps else None,
    }


def _verdict(alone: dict, harvest: dict) -> str:
    """harvest keeps the steps decode alone keeps (99 % at least) and its job learns."""
    if not harvest["num_steps"]:
        return "no steps: the replay decoded nothing"
    job_misses = sum(n for cause, n in harvest["misses_by_cause"].items() if cause != "decode")
    share = harvest["steps_within_target"]
    if share < min(0.99, alone["steps_within_target"]):
        return f"MISS: {100 * share:.2f} % of steps in target; {job_misses} missed for the job's time"
    if not harvest["optimizer_steps"]:
        return "MISS: the job made no optimizer step"
    return f"ok: {100 * share:.2f} % of steps in target ({job_misses} missed for the job's time)"


def _write_job(log_dir: Path, model_path: str, args: argparse.Namespace) -> Path:
    from harvest.finetune.demo.make_dataset import DATASET_NAME, DEMO_DIR

    job = {
        "model_name_or_path": model_path, "stage": "sft", "do_train": True, "finetuning_type": "lora",
        "lora_rank": 8, "lora_target": "all", "dataset": DATASET_NAME, "dataset_dir": str(DEMO_DIR),
        "template": "default", "cutoff_len": 64, "max_samples": args.epoch_samples,
        "per_device_train_batch_size": 2, "learning_rate": 1.0e-3, "max_steps": 10**6, "save_steps": 10**6,
        "output_dir": str((log_dir / "harvest" / "adapter").resolve()), "overwrite_output_dir": True,
        "report_to": "none", "seed": 42,
    }
    if args.publish_every_steps > 0:
        job |= {"publish_every_steps": args.publish_every_steps, "publish_name": "bench-slo"}
    path = log_dir / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def _wait_published(worker: WorkerProcess, step: int, every_steps: int) -> dict | None:
    """The publisher's counts once it served (or failed) the version due by the replay's end (its last optimizer
    step rounded down to a multiple of `every_steps`): a load in flight when the replay ended still counts."""
    if every_steps <= 0:
        return None
    due_step = step - step % every_steps

    def settled(stats: dict) -> bool:
        published = stats["finetune"].get("published") or {}
        return due_step == 0 or (published.get("step") or 0) >= due_step or published.get("error") is not None

    published = wait_for_stats(worker.admin_url, settled, f"the version of step {due_step} served",
                               timeout_s=JOB_WAIT_S)["finetune"].get("published") or {}
    return {key: published.get(key) for key in ("num_published", "num_dropped", "num_failed", "error")}


def _admin_post(worker: WorkerProcess, path: str) -> dict:
    response = httpx.post(f"{worker.admin_url}{path}", timeout=60)
    if response.is_error:
        raise HarvestError(f"{path} answered {response.status_code}: {response.text[:300]}")
    return response.json()


def _worker(args, model_path: str, job_path: Path, log_dir: Path, name: str, tpot_slo_ms: float) -> WorkerProcess:
    run_dir = log_dir / name
    run_dir.mkdir(parents=True, exist_ok=True)
    job = yaml.safe_load(job_path.read_text())
    run_job = run_dir / "job.yaml"
    run_job.write_text(yaml.safe_dump({**job, "output_dir": str((run_dir / "adapter").resolve())}))
    flags = ["--model-path", model_path, "--max-total-tokens", str(args.max_total_tokens),
             "--finetune", str(run_job), "--tpot-slo-ms", str(tpot_slo_ms)]
    port, admin_port = free_ports(2)
    return WorkerProcess(flags, port, admin_port, run_dir / "worker.log").start(args.start_timeout_s)


def _wait_for_job(worker: WorkerProcess, state: str) -> None:
    wait_for_stats(worker.admin_url, lambda stats: stats["finetune"]["state"] == state, f"the job {state}",
                   timeout_s=JOB_WAIT_S)


def _trace(args: argparse.Namespace, rate_scale: float):
    from traces.trace_loader import load_trace

    trace = load_trace(args.trace).window(args.window_start_s, args.window_s / rate_scale).scale_rate(rate_scale)
    return trace.window(0, args.window_s).cap_lengths(args.max_context_tokens, args.max_generated_tokens)


def _batch_one_step_ms(worker: WorkerProcess, args: argparse.Namespace) -> float:
    """The median decode step of one request alone, at the window's longest lengths: the host's speed."""
    from harvest.replay.live_replay import LiveReplay
    from traces.trace import Trace

    since = read_last_step_seq(worker.admin_url)
    probe = Trace("probe", np.zeros(1), np.array([args.max_context_tokens]), np.array([args.max_generated_tokens]))
    LiveReplay(worker.url, worker.admin_url, 1e9).run(probe)
    return float(np.median([s["latency_ms"] for s in read_steps_since(worker.admin_url, since)
                            if s["batch_size"] == 1]))


def _replay(worker: WorkerProcess, args: argparse.Namespace, rate_scale: float, tpot_slo_ms: float) -> list[dict]:
    from harvest.replay.live_replay import LiveReplay

    since = read_last_step_seq(worker.admin_url)
    LiveReplay(worker.url, worker.admin_url, tpot_slo_ms, args.concurrency, drain_s=args.drain_s).run(
        _trace(args, rate_scale))
    return read_steps_since(worker.admin_url, since)


def print_result(result: dict, console) -> None:
    table = Table(title=f"harvest bench slo (target {result['tpot_slo_ms']} ms = decode alone's p99 x "
                        f"{result['tpot_slo_ms'] / result['decode_alone_p99_ms']:.2f})", title_justify="left")
    for column in ("row", "steps", "in target", *MISS_CAUSES, "finetune tok/s", "optimizer steps"):
        table.add_column(column, justify="left" if column == "row" else "right")
    for name in ("decode_alone", "harvest"):
        row = result[name]
        table.add_row(name.replace("_", " "), str(row["num_steps"]), f"{100 * row['steps_within_target']:.2f} %",
                      *(str(row["misses_by_cause"][c]) for c in MISS_CAUSES),
                      str(row.get("finetune_tokens_per_s", "-")), str(row.get("optimizer_steps", "-")))
    console.print(table)
    console.print(f"verdict: {result['verdict']}")
