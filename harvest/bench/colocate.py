"""`harvest bench colocate`: harvest against what a user would run instead, live, on the same trace windows.

Every row is a live replay (`harvest.replay.LiveReplay`) of the same trace window against a decode worker,
`harvest serve` with its defaults (the embedded model, SGLang's CPU flags):
- decode alone: the worker without a job;
- harvest, one row per co-location mode (HARVEST_MODES): the worker with the LoRA job inside;
- two processes, defaults: the worker without a job beside `llamafactory-cli train` on the same YAML;
- two processes, pinned: the worker under `taskset -c` on the first half of the cores and the trainer on
  the second half, OMP_NUM_THREADS = half the cores for each: the static split a user would pick.

Steps within target come from the worker's own step records for every row (the worker without a job
records its steps too), a step counting what its requests waited for: decode, the finetune slice after it
and an idle-time unit it waited for; TPOT is per request, client side. Finetune tokens are non-padding tokens: the
job's count (admin stats) for harvest, LlamaFactory's `total_tokens` (trainer_process.py) for the trainer,
both over the replay's own wall time. The job and the trainer are past `--warmup-steps` optimizer steps
when a replay starts. A load sweep (several --rate-scale) replays a window at each scale to one worker (and
trainer) per row, started once for the sweep: a serving worker sees its load change, it is not restarted for
it, and a fresh worker's start and warm-up for every scale cost more than the replays. Rows and scales
alternate order between repeats (reversed on odd repeats: the job's age is not tied to one scale). Why the
numbers are what they are: eval/README.md, "harvest against two processes". Each window gets a verdict (JSON
`verdicts`, a line after the table): the default against the row that trained most, within the rows' A/A spread,
and against the best row that kept the target (_verdicts). Each run is also appended to
--log-dir's runs.jsonl as it ends, so a sweep stopped midway keeps what it measured, and carries the host's
cost of crossing cores probed as its row began (host_probe.py): rows compare where it held still.

Deferred imports: each bench imports its machinery (torch, SGLang, the replay) when it runs, not when `harvest bench`
lists it.
"""

import argparse
import contextlib
import datetime
import json
import os
import re
import shlex
import signal
import statistics
import sys
import time
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

from base.errors import HarvestError
from harvest.bench import device_name
from harvest.bench.flags import add_replay_arguments, add_worker_arguments
from harvest.bench.host_probe import probe_host
from harvest.bench.trainer_process import TrainerProcess, cpu_halves
from harvest.models import resolve_model_path
from harvest.worker.client import read_stats
from harvest.worker.process import WorkerProcess, free_ports

DEMO_JOB = Path(__file__).resolve().parents[1] / "finetune" / "demo" / "demo.yaml"
RUNS_LOG = "runs.jsonl"  # in --log-dir: the runs so far, one JSON line each (the result's "runs")
CORE_PROFILE = Path(__file__).resolve().parents[2] / "predictor" / "profiles" / "cpu-cores-smollm2-135m.json"
HARVEST_MODES = {
    # co-location mode: the `harvest serve` flags that select it, from the bench's flags (a new mode is one line)
    # no flag: what `harvest serve` runs by default (on a CPU host of two cores or more, the split chosen live)
    "default": lambda args: (),
    "temporal": lambda args: ("--colocation", "temporal"),
    # with a co-run profile of this host's core partitions (--profile): the planner picks (2, 0) or (1, 1) per step
    "spatial": lambda args: ("--profile", args.profile),
    # the static split inside one process: decode on the first half of the cores, the job's partition on the rest
    "pinned": lambda args: ("--pin-partition", ",".join(str(len(half)) for half in cpu_halves())),
}
ROWS = {  # row id (--rows, JSON): what the table calls it; in run order (reversed on odd repeats)
    "decode-alone": "decode alone",
    "two-process": "two processes, defaults",
    **{f"harvest-{mode}": f"harvest ({mode})" for mode in HARVEST_MODES},
    "two-process-pinned": "two processes, pinned",
}
DEFAULT_WINDOWS = ("steady=conv:17s+12s", "bursty=code:179s+12s")
_WINDOW = re.compile(r"^(\w+)=([^:]+):([\d.]+s?)\+([\d.]+s?)$")
JOB_POLL_S = 1.0
TARGET_SHARE = 0.999
"""The share of steps within the TPOT target harvest keeps (issue 36's acceptance; the controller's quantiles)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--window", action="append", default=None, metavar="NAME=TRACE:START+LENGTH",
                        help=f"a trace window to replay (repeatable; default {' '.join(DEFAULT_WINDOWS)})")
    parser.add_argument("--rate-scale", default="0.1",
                        help="replay rate scale (default 0.1, as the demo); comma-separated: a load sweep, every "
                             "window at each scale (its rows named WINDOW@SCALE)")
    add_worker_arguments(parser, log_dir="runs/bench-colocate")
    add_replay_arguments(parser)
    parser.add_argument("--repeats", type=int, default=2, help="repeats per window; odd ones reverse the row order")
    parser.add_argument("--rows", default="all", help=f"comma-separated row ids: {','.join(ROWS)} (default all)")
    parser.add_argument("--job", default=None, help="LlamaFactory YAML (default: the demo job)")
    parser.add_argument("--warmup-steps", type=int, default=1,
                        help="optimizer steps the job or trainer has done before a replay starts (default 1)")
    parser.add_argument("--dtype", default="auto",
                        help="every decode worker's serving dtype (SGLang flag; float32 on a CPU: the job computes "
                             "on the served weights, one copy)")
    parser.add_argument("--profile", default=str(CORE_PROFILE),
                        help="the spatial row's co-run profile (default: the shipped one of a 2-core CPU host)")


def run(args: argparse.Namespace) -> dict:
    scales = _parse_scales(args.rate_scale)
    bases = [parse_window(text) for text in (args.window or DEFAULT_WINDOWS)]
    windows = [(_window_name(name, scale, scales), spec, scale) for name, spec in bases for scale in scales]
    rows = tuple(ROWS) if args.rows == "all" else tuple(r.strip() for r in args.rows.split(","))
    if unknown := [r for r in rows if r not in ROWS]:
        raise HarvestError(f"--rows: unknown row {unknown[0]!r}; rows: {','.join(ROWS)}")
    if args.repeats < 1 or args.warmup_steps < 1:
        raise HarvestError("--repeats and --warmup-steps must be >= 1")
    if "harvest-spatial" in rows:
        from predictor import Profile

        Profile.load(args.profile)  # a bad profile is refused here, not by the first spatial worker
    traces = {name: load_window(spec, scale, args) for name, spec, scale in windows}
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    model_path = str(resolve_model_path(args.model_path))
    job = bench_job(args.job, model_path, log_dir)
    load_start = os.getloadavg()[0]
    started = time.perf_counter()
    runs = []
    (log_dir / RUNS_LOG).unlink(missing_ok=True)  # this bench's runs only
    # SIGTERM unwinds like Ctrl-C, so the `finally` clauses stop every worker and trainer.
    previous_handler = signal.signal(signal.SIGTERM, _interrupt)
    worker, worker_key = None, None
    try:
        for base, _ in bases:
            for repeat in range(args.repeats):
                order = 1 if repeat % 2 == 0 else -1
                for row in rows[::order]:
                    run_dir = log_dir / f"{base}-{repeat}-{row}"
                    flags, cpus = _worker_config(row, job, model_path, run_dir, args)
                    # Adjacent rows on the same worker without a job share it (decode alone and two processes,
                    # defaults): a worker with a job is never reused across rows, its job would carry over.
                    is_new_worker = (flags, cpus) != worker_key or "--finetune" in flags
                    if is_new_worker and worker is not None:
                        worker.stop()
                    # Before the row's worker starts (or while the one kept from the row before idles) and before
                    # its trainer: the host as the row meets it.
                    host = probe_host()
                    if is_new_worker:
                        worker, worker_key = bench_worker(flags, run_dir, cpus), (flags, cpus)
                        worker.start(args.start_timeout_s)
                    with _row_trainer(row, job, worker, run_dir, args) as trainer:
                        for scale in scales[::order]:
                            name = _window_name(base, scale, scales)
                            print(f"bench colocate: {name} repeat {repeat}: {ROWS[row]}", file=sys.stderr)
                            runs.append({"window": name, "repeat": repeat, "row": row, "host": host,
                                         **_run_row(row, name, traces[name], worker, trainer, run_dir, args)})
                            # each run as it ends: a sweep stopped midway (host, Ctrl-C) keeps what it measured
                            with (log_dir / RUNS_LOG).open("a") as f:
                                f.write(json.dumps(runs[-1]) + "\n")
    finally:
        if worker is not None:
            worker.stop()
        signal.signal(signal.SIGTERM, previous_handler)
    return {
        "table": _table(runs),
        "tpot_stretch_vs_decode_alone": _stretch(runs),
        "verdicts": _verdicts(runs),
        "runs": runs,
        "windows": {name: {"spec": spec, "rate_scale": scale, **traces[name].summary()}
                    for name, spec, scale in windows},
        "config": {"tpot_slo_ms": args.tpot_ms, "rate_scale": scales, "concurrency": args.concurrency,
                   "max_context_tokens": args.max_context_tokens,
                   "max_generated_tokens": args.max_generated_tokens, "repeats": args.repeats,
                   "warmup_steps": args.warmup_steps, "dtype": args.dtype, "profile": args.profile, "job": job,
                   "harvest_modes": {mode: list(flags(args)) for mode, flags in HARVEST_MODES.items()}},
        "device": device_name(is_cpu_host=True),  # core-pinned rows: a CPU host
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "wall_s": round(time.perf_counter() - started, 1),
        "load_avg_1m_start": round(load_start, 2),
        "load_avg_1m_end": round(os.getloadavg()[0], 2),
        "command": _command(args),
    }


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _window_name(name: str, scale: float, scales: list[float]) -> str:
    return name if len(scales) == 1 else f"{name}@{scale:g}"


def parse_window(text: str) -> tuple[str, str]:
    if not _WINDOW.match(text):
        raise HarvestError(f"--window {text!r}: expected NAME=TRACE:START+LENGTH, e.g. steady=conv:17s+12s")
    name, spec = text.split("=", 1)
    return name, spec


def _parse_scales(text: str) -> list[float]:
    try:
        scales = [float(part) for part in str(text).split(",")]
    except ValueError:
        scales = []
    if not scales or not all(0 < scale < float("inf") for scale in scales):
        raise HarvestError(f"--rate-scale {text!r}: expected positive numbers, comma-separated (e.g. 0.05,0.1,0.2)")
    return scales


def load_window(spec: str, rate_scale: float, args: argparse.Namespace):
    from harvest.replay.replay_run import ReplayRunConfig, load_replay_trace

    trace, start, length = _WINDOW.match(f"window={spec}").group(2, 3, 4)
    config = ReplayRunConfig(trace=trace, out="", window=length, window_start=start, rate_scale=rate_scale,
                             max_context_tokens=args.max_context_tokens,
                             max_generated_tokens=args.max_generated_tokens)
    loaded = load_replay_trace(config)
    if loaded.num_requests == 0:
        raise HarvestError(f"--window {spec}: no request arrives in this window")
    return loaded


def bench_job(job_path: str | None, model_path: str, log_dir: Path) -> dict:
    """The LlamaFactory config both harvest and the trainer run, with absolute paths (as `harvest demo`)."""
    path = Path(job_path) if job_path else DEMO_JOB
    try:
        job = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise HarvestError(f"--job {path}: {e}") from None
    if not isinstance(job, dict):
        raise HarvestError(f"--job {path}: not a YAML mapping")
    if job.get("model_name_or_path") in (None, "harvest:embedded"):
        job["model_name_or_path"] = model_path
    job["dataset_dir"] = str((path.parent / job.get("dataset_dir", ".")).resolve())
    job.update(output_dir=str((log_dir / "adapter").resolve()), max_steps=10**6, save_steps=10**9)
    return job


def _worker_config(row: str, job: dict, model_path: str, run_dir: Path,
                   args: argparse.Namespace) -> tuple[tuple[str, ...], tuple[int, ...] | None]:
    """(`harvest serve` flags, the cores it is pinned to or None) of the row's decode worker."""
    # Every row's scheduler runs at most the requests the replay keeps in flight, and knows it (a slice's
    # growth limit reads the cap): a decode worker is deployed with its max_running_requests set.
    flags = ["--model-path", model_path, "--max-total-tokens", str(args.max_total_tokens), "--dtype", args.dtype,
             "--max-running-requests", str(args.concurrency)]
    if row.startswith("harvest-"):
        job_path = run_dir / "job.yaml"
        run_dir.mkdir(parents=True, exist_ok=True)
        job_path.write_text(yaml.safe_dump({**job, "output_dir": str((run_dir / "adapter").resolve())}))
        flags += ["--finetune", str(job_path), "--tpot-slo-ms", str(args.tpot_ms),
                  *HARVEST_MODES[row.removeprefix("harvest-")](args)]
    cpus = tuple(cpu_halves()[0]) if row == "two-process-pinned" else None
    return tuple(flags), cpus


@contextlib.contextmanager
def _row_trainer(row: str, job: dict, worker: WorkerProcess, run_dir: Path, args: argparse.Namespace):
    """What trains beside the row's worker, past its warm-up steps, for all the row's replays: a trainer
    process (yielded, stopped after them) on a two-process row; on a harvest row, the worker's own job."""
    if row.startswith("harvest-"):
        wait_job_steps(worker.admin_url, args.warmup_steps, args.start_timeout_s)
    if not row.startswith("two-process"):
        yield None
        return
    trainer_cpus = cpu_halves()[1] if row == "two-process-pinned" else None
    trainer = TrainerProcess(job, run_dir / "trainer", trainer_cpus, len(trainer_cpus) if trainer_cpus else None)
    trainer.start(args.warmup_steps, args.start_timeout_s)
    try:
        yield trainer
    finally:
        trainer.stop()


def _run_row(row: str, name: str, trace, worker: WorkerProcess, trainer: TrainerProcess | None, run_dir: Path,
             args: argparse.Namespace) -> dict:
    """One replay of window `name` to the row's worker; its figures are over this replay alone."""
    from harvest.replay.live_replay import LiveReplay

    base_weights, co_run, splits = {}, None, None
    replay = LiveReplay(worker.url, worker.admin_url, args.tpot_ms, args.concurrency, drain_s=args.drain_s)
    stats_before = read_stats(worker.admin_url) if row.startswith("harvest-") else {}
    replay_start_wall_s = time.time()
    results = replay.run(trace)
    run_dir.mkdir(parents=True, exist_ok=True)
    replay_path = run_dir / f"replay-{name}.json"  # `harvest replay`'s results.json, for a closer look
    replay_path.write_text(json.dumps(results))
    # The worker's step records over the replay: each step's split (infer_sms, ft_sms), its slice, its wait.
    steps_path = run_dir / f"steps-{name}.json"
    steps_path.write_text(json.dumps(replay.steps))
    replay_s = results["replay_s"]
    if trainer is not None:
        trainer.wait_logged_after(replay_start_wall_s + replay_s, args.start_timeout_s)
        finetune_tokens = trainer.tokens_between(replay_start_wall_s, replay_start_wall_s + replay_s)
        counted_by = "llamafactory trainer_log.jsonl total_tokens (non_padding), interpolated per step"
    else:
        # the worker's whole stats after the replay (controller, unit times, predictor), for a closer look
        stats = read_stats(worker.admin_url)
        (run_dir / f"worker_stats-{name}.json").write_text(json.dumps(stats, indent=1))
        base_weights = (stats.get("finetune") or {}).get("base_weights") or {}
        colocation = stats.get("colocation") or {}
        co_run = _partition_rates(stats_before, stats)
        # Where the worker chose its split live: the phases each split ran (the worker's whole life so far).
        chooser = colocation.get("chooser")
        splits = None if chooser is None else {split: e["phases"] for split, e in chooser["splits"].items()}
        before, after = (results["policies"]["live"]["finetune"][k] or {} for k in ("before", "after"))
        finetune_tokens = after["tokens"] - before["tokens"] if "tokens" in after else None
        counted_by = "harvest job stats: tokens (non-padding)" if finetune_tokens is not None else None
    decode = results["policies"]["live"]["decode"]
    return {
        "steps_within_target": decode["step_slo_attainment"],
        "num_steps": decode["num_steps"],
        "num_steps_over_target_by_decode_alone": decode["num_steps_over_target_by_decode_alone"],
        "step_ms_p50": decode["step_latency_ms_p50"],
        "step_ms_p99": decode["step_latency_ms_p99"],
        "tpot_ms_p50": decode["tpot_ms_p50"],
        "tpot_ms_p99": decode["tpot_ms_p99"],
        "requests_within_target": decode["request_tpot_slo_attainment"],
        "num_requests": decode["num_requests"],
        "num_unfinished_requests": decode["num_unfinished_requests"],
        "num_failed_requests": decode["num_failed_requests"],
        "finetune_tokens": finetune_tokens,
        "finetune_tokens_per_s": None if finetune_tokens is None else round(finetune_tokens / replay_s, 2),
        "finetune_counted_by": counted_by,
        "base_weights": base_weights.get("mode"),  # the job's (shared or copy); None without one
        "co_run_tokens_per_s": co_run,
        "phases_per_split": splits,
        "replay_s": replay_s,
        "notes": results["notes"],
        "log_dir": str(run_dir),
        "replay_results": str(replay_path),
        "step_records": str(steps_path),
        "worker_log": str(worker.log_path),
    }


def _partition_rates(before: dict, after: dict) -> dict:
    """Where the job held a finetune partition during the replay: the trained tokens/s of its work there, over
    the time it held it then (the same window as the trainer's; None where it held it under a second). Its work
    is the tokens through its units there, in trained tokens at the job's own ratio of the two: a micro-batch's
    tokens are counted at its embedding, which may run elsewhere, so counting them would lump the rate."""
    job_tokens = (after.get("finetune") or {}).get("tokens") or 0
    job_work = (after.get("colocation") or {}).get("unit_tokens") or 0
    rates = {}
    for partition, entry in ((after.get("colocation") or {}).get("co_run") or {}).items():
        start = ((before.get("colocation") or {}).get("co_run") or {}).get(partition, {})
        ms = entry["ms_granted"] - start.get("ms_granted", 0.0)
        work = entry["unit_tokens"] - start.get("unit_tokens", 0)
        rates[partition] = round(work * job_tokens / job_work / ms * 1e3, 3) if ms >= 1e3 and job_work else None
    return rates


def bench_worker(serve_flags: tuple[str, ...], run_dir: Path, cpus: tuple[int, ...] | None) -> WorkerProcess:
    from base.cuda_driver import ensure_driver_or_stub  # deferred: test_gpu_twin's H100 stand-in patches it
    from harvest.sglang.launcher import CPU_ENGINE_ENV

    port, admin_port = free_ports(2)
    env = dict(CPU_ENGINE_ENV) if ensure_driver_or_stub() else {}
    command = [sys.executable, "-m", "harvest.cli.main", "serve"]
    if cpus is not None:
        cpu_list = ",".join(map(str, cpus))
        command = ["taskset", "-c", cpu_list, *command]
        # SGLang binds its OpenMP threads itself on CPUs with AMX: keep them on the worker's half too.
        env.update(OMP_NUM_THREADS=str(len(cpus)), SGLANG_CPU_OMP_THREADS_BIND=cpu_list)
    return WorkerProcess([*serve_flags, "--admin-port", str(admin_port)], port, admin_port,
                         run_dir / "worker.log", command=command, env=env, stop_with_parent=True)


def wait_job_steps(admin_url: str, num_steps: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        finetune = read_stats(admin_url).get("finetune") or {}
        if finetune.get("state") in ("failed", "stopped", "finished"):
            raise HarvestError(f"the finetune job is {finetune['state']} before the replay: {finetune.get('error')}")
        if finetune.get("step", 0) >= num_steps:
            return
        time.sleep(JOB_POLL_S)
    raise HarvestError(f"the finetune job did not reach step {num_steps} in {timeout_s:.0f} s")


TABLE_METRICS = ("steps_within_target", "tpot_ms_p50", "tpot_ms_p99", "finetune_tokens_per_s", "replay_s",
                 "num_unfinished_requests")


def _by_window_and_row(runs: list[dict]) -> dict[str, dict[str, list[dict]]]:
    """window -> row -> its runs (the repeats), in run order."""
    grouped: dict[str, dict[str, list[dict]]] = {}
    for run in runs:
        grouped.setdefault(run["window"], {}).setdefault(run["row"], []).append(run)
    return grouped


def _table(runs: list[dict]) -> dict:
    """Per window and row: the median over repeats of each metric (None where a run has none)."""
    return {window: {row: {metric: _median([r[metric] for r in row_runs]) for metric in TABLE_METRICS}
                     | {"num_runs": len(row_runs)} for row, row_runs in by_row.items()}
            for window, by_row in _by_window_and_row(runs).items()}


def _stretch(runs: list[dict]) -> dict:
    """How much each harvest mode stretches request TPOT beyond decode alone, per window (median runs)."""
    table, out = _table(runs), {}
    for window, by_row in table.items():
        alone = by_row.get("decode-alone")
        for row, entry in by_row.items():
            if alone and row.startswith("harvest-") and alone["tpot_ms_p50"] and entry["tpot_ms_p50"]:
                out.setdefault(window, {})[row] = {
                    "tpot_p50_ratio": round(entry["tpot_ms_p50"] / alone["tpot_ms_p50"], 3),
                    "tpot_p99_ratio": round(entry["tpot_ms_p99"] / alone["tpot_ms_p99"], 3),
                }
    return out


def _verdicts(runs: list[dict]) -> dict:
    """Per window, the claim the bench is for: harvest's default keeps TARGET_SHARE of its steps in the target and
    trains at least as much as every other row that trains. Each row's figures are medians over repeats; its A/A
    spread is its largest repeat's tok/s over its smallest, less 1 (None with one repeat). Against the row that
    trained most: "ahead" at a ratio of 1 or more, "within noise" where the gap is no larger than the larger A/A
    spread of the two rows (two runs of one row differ that much), else "behind"; "misses the target" first,
    where the default kept fewer steps in any repeat. A row that trains more by missing the target is no
    alternative to a user with one, so the ratio to the best row that kept it in every repeat is given too."""
    verdicts = {}
    for window, by_row in _by_window_and_row(runs).items():
        rows = {row: _row_summary(row_runs) for row, row_runs in by_row.items()}
        rows = {row: summary for row, summary in rows.items() if summary["tokens_per_s"] is not None}
        default = rows.get("harvest-default")
        others = [row for row in rows if row != "harvest-default"]
        if default is None or not others:
            continue
        best = max(others, key=lambda row: rows[row]["tokens_per_s"])
        ratio = _ratio(default["tokens_per_s"], rows[best]["tokens_per_s"])
        spreads = (default["aa_spread"], rows[best]["aa_spread"])
        spread = None if None in spreads else max(spreads)
        if not default["keeps_target"]:
            verdict = "misses the target"
        elif ratio is not None and ratio >= 1:
            verdict = "ahead"
        elif ratio is not None and spread is not None and ratio >= 1 / (1 + spread):
            verdict = "within noise"
        else:
            verdict = "behind"
        keeping = [row for row in others if rows[row]["keeps_target"]]
        best_keeping = max(keeping, key=lambda row: rows[row]["tokens_per_s"], default=None)
        verdicts[window] = {
            "verdict": verdict, "best_row": best, "ratio": ratio, "aa_spread": spread,
            "best_row_keeping_target": best_keeping,
            "ratio_to_best_row_keeping_target": None if best_keeping is None
            else _ratio(default["tokens_per_s"], rows[best_keeping]["tokens_per_s"]),
            "rows": rows,
        }
    return verdicts


def _row_summary(row_runs: list[dict]) -> dict:
    rates = [r["finetune_tokens_per_s"] for r in row_runs if r["finetune_tokens_per_s"] is not None]
    shares = [r["steps_within_target"] for r in row_runs]
    return {"tokens_per_s": _median(rates), "steps_within_target": _median(shares),
            "aa_spread": round(max(rates) / min(rates) - 1, 4) if len(rates) > 1 and min(rates) > 0 else None,
            "keeps_target": all(share is not None and share >= TARGET_SHARE for share in shares)}


def _ratio(value: float, other: float) -> float | None:
    return round(value / other, 3) if other else None


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 4) if values else None


def print_result(result: dict, console) -> None:
    console = Console(file=console.file, width=max(console.width, 132))  # rows in one line each, even in a log
    table = Table(title="harvest bench colocate (medians over repeats)", title_justify="left")
    for column in ("window", "row", "steps in target", "TPOT p50 ms", "TPOT p99 ms", "finetune tok/s",
                   "replay s", "unfinished", "runs"):
        table.add_column(column, justify="left" if column in ("window", "row") else "right")
    for window, by_row in result["table"].items():
        for row, e in by_row.items():
            share = "-" if e["steps_within_target"] is None else f"{100 * e['steps_within_target']:.1f} %"
            table.add_row(window, ROWS.get(row, row), share, _cell(e["tpot_ms_p50"]), _cell(e["tpot_ms_p99"]),
                          _cell(e["finetune_tokens_per_s"]), _cell(e["replay_s"]),
                          f"{e['num_unfinished_requests']:g}", str(e["num_runs"]))
    console.print(table)
    for window, rows in result["tpot_stretch_vs_decode_alone"].items():
        for row, ratio in rows.items():
            console.print(f"{window}: {ROWS.get(row, row)} stretches TPOT x{ratio['tpot_p50_ratio']} (p50), "
                          f"x{ratio['tpot_p99_ratio']} (p99) beyond decode alone")
    for window, v in result["verdicts"].items():
        console.print(f"{window}: {_verdict_line(v)}")


def _verdict_line(v: dict) -> str:
    def row(name: str) -> str:
        e = v["rows"][name]
        kept = "" if e["keeps_target"] else ", misses it"
        share = ("no steps" if e["steps_within_target"] is None
                 else f"{100 * e['steps_within_target']:.2f} % in target") + kept
        return f"{ROWS.get(name, name)} {e['tokens_per_s']:.1f} tok/s ({share})"

    spread = "one repeat, no A/A spread" if v["aa_spread"] is None else f"A/A spread {100 * v['aa_spread']:.0f} %"
    line = f"{v['verdict'].upper()}: {row('harvest-default')} against {row(v['best_row'])}: x{v['ratio']} ({spread})"
    keeping = v["best_row_keeping_target"]
    if keeping is None:
        line += "; no other row kept the target in every repeat"
    elif keeping != v["best_row"]:
        line += (f"; against the best row that keeps the target, {row(keeping)}: "
                 f"x{v['ratio_to_best_row_keeping_target']}")
    return line


def _cell(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def _command(args: argparse.Namespace) -> str:
    argv = ["harvest", "bench", "colocate"]
    for window in args.window or DEFAULT_WINDOWS:
        argv += ["--window", window]
    for flag in ("rate_scale", "max_context_tokens", "max_generated_tokens", "concurrency", "tpot_ms", "drain_s",
                 "repeats", "rows", "job", "model_path", "warmup_steps", "max_total_tokens", "dtype", "profile"):
        if getattr(args, flag) is not None:
            argv += ["--" + flag.replace("_", "-"), str(getattr(args, flag))]
    return shlex.join(argv)


