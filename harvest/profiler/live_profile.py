"""A live decode-latency profile: start a real worker, visit every sample point in shuffled passes, fit and
write the two-stage profile (and, with a finetune YAML, the job's solo throughput measured afterwards).

One code path for both kinds of device (profiled_device.py: CPU core sets, or a GPU's SM partitions on
green contexts). Without --co-run the device is one partition (the finetune job runs between decode steps),
so the profile is solo-only plus the finetune job's solo throughput, measured after the worker has stopped
so the two never share the device. With --co-run the worker is spatial and pinned per visit
(DecodeProfiler, POST /harvest/partition): solo on every partition the device forms with the job paused,
and co-run with the job training on the finetune side, whose co-run finetune rate the worker measures
(SpatialController stats); then the job alone on each finetune side it co-ran on. Why visits are shuffled,
re-queued when disturbed and reduced by their minimum: eval/README.md, "Live profiling on a shared host".

Deferred imports: the worker, its client and the finetune and load drivers only where a live profile starts them.
"""

import os
import random
import statistics
import tempfile
import time
from collections import Counter, deque
from dataclasses import dataclass
from pathlib import Path

from rich.progress import Progress

from base.errors import HarvestError
from harvest.models import EMBEDDED_MODEL_PLACEHOLDER, resolve_model_path
from harvest.profiler import DecodeProfiler
from harvest.worker.client import read_stats, wait_for_stats
from predictor.config import DEFAULT_CONFIG
from predictor.finetune_throughput import FinetuneThroughput
from predictor.profile import Profile
from predictor.samples import write_samples
from predictor.sampling_plan import SamplingPlan


@dataclass(frozen=True, slots=True)
class LiveProfileConfig:
    out: str
    """Profile JSON to write; samples go beside it."""
    model_path: str | None = None
    """HF model dir; None: the embedded SmolLM2-135M."""
    finetune: str | None = None
    """LlamaFactory YAML whose solo throughput to measure and record (after the decode steps)."""
    finetune_steps: int = 3
    finetune_max_unit_ms: float | None = None
    max_batch_size: int = 16
    max_seq_len: int = 1024
    seq_levels: int = 3
    repeats: int = 3
    held_out: int = 12
    passes: int = 5
    max_foreign_cores: float = 0.1
    max_revisits: int = 2
    statistic: str = "min"
    port: int = 30010
    admin_port: int = 30110
    dtype: str = "auto"
    """The worker's serving dtype (SGLang's --dtype): serve with the one profiled."""
    co_run: bool = False
    """Profile the device's partitions too (cores of a CPU, SMs of a GPU): decode on some with the finetune job
    co-running on others."""


def median_visit(visits):
    """The visit with the median latency (its seq_len stays the one measured with it)."""
    return sorted(visits, key=lambda s: s.latency_ms)[len(visits) // 2]


def min_visit(visits):
    """The fastest visit (each visit is itself the median of its steps, so one fast step does not make it):
    disturbance on a shared host only slows a visit, so the fastest one estimates the undisturbed device."""
    return min(visits, key=lambda s: s.latency_ms)


VISIT_STATISTICS = {"median": median_visit, "min": min_visit}


def recorded_path(path: str | Path) -> str:
    """A path as a profile records it: relative to the working directory (the repository) when inside it,
    so a shipped profile names no machine's directories."""
    absolute = Path(path).resolve()
    try:
        return str(absolute.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def run_live_profile(config: LiveProfileConfig, console) -> dict:
    """Profile, write the profile and its samples, and return the run's summary."""

    from harvest.profiler.foreign_load import ForeignLoad
    from harvest.profiler.profiled_device import cpu_model_name, local_device
    from harvest.worker.process import WorkerProcess

    if config.finetune is not None and not Path(config.finetune).is_file():
        raise HarvestError(f"--finetune {config.finetune!r}: no such file")
    if config.co_run and config.finetune is None:
        raise HarvestError("--co-run needs --finetune: the job that co-runs beside decode")
    if config.repeats < 1 or config.passes < 1:
        raise HarvestError(f"--repeats and --passes must be >= 1, got {config.repeats} and {config.passes}")
    device = local_device()
    if config.co_run:
        device.check_co_run()
    out = Path(config.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    model_path = resolve_model_path(config.model_path)
    # A co-run profile's "SMs" are the device's partition units: SMs of a GPU, cores of a CPU host.
    grid = device.grid(config.co_run)
    max_kv_tokens = config.max_batch_size * (config.max_seq_len + 64)
    plan = SamplingPlan(grid, config.max_batch_size, config.max_seq_len, max_kv_tokens=max_kv_tokens,
                        num_seq_levels=config.seq_levels,
                        num_held_out_per_partition=config.held_out)
    points, dropped_partitions = device.measurable(plan.points(), config.co_run)
    num_co_run_fit = sum(1 for p in points if p.ft_sms and not p.is_held_out)
    if config.co_run and num_co_run_fit < DEFAULT_CONFIG.min_colo_samples:
        # Known before any worker starts: the plan takes 2 lengths x up to 3 batch sizes per co-run pair.
        raise HarvestError(f"--co-run: the plan has {num_co_run_fit} co-run shapes to fit and stage 2 needs >= "
                           f"{DEFAULT_CONFIG.min_colo_samples}: raise --max-batch-size (>= 6 gives 3 batch sizes)")
    log_dir = Path(tempfile.mkdtemp(prefix="harvest-profile-"))
    worker = WorkerProcess(
        ["--model-path", str(model_path), "--max-running-requests", str(config.max_batch_size),
         # PD decode reserves room to grow each running request (num_reserved_decode_tokens, 512) on top.
         "--max-total-tokens", str(max_kv_tokens + 512 * config.max_batch_size + 1024), "--dtype", config.dtype,
         *WORKER_FLAGS, *_co_run_flags(config, grid)],
        config.port, config.admin_port, log_dir / "worker.log",
    )
    started = time.perf_counter()
    with console.status("starting the worker ..."):
        worker.start()
    startup_s = time.perf_counter() - started
    fit, held_out = [], []
    co_run_rates = {}
    try:
        profiler = DecodeProfiler(worker.url, worker.admin_url, grid, config.repeats, can_pin=config.co_run)
        if config.co_run:
            with console.status("waiting for the finetune job to build ..."):
                _wait_for_job(worker.admin_url)
        # Shuffled passes spread drift over fit and held-out points alike; a visit during which other
        # processes took CPU (ForeignLoad) is queued again for later. The largest shape runs first,
        # unrecorded, so allocator arenas and caches are warm.
        visits = [p for p in points for _ in range(config.passes)]
        random.Random(0).shuffle(visits)
        largest = max(points, key=lambda p: p.batch_size * p.seq_len)
        with console.status("warming up on the largest shape ..."):
            profiler.measure(largest)
        measured: dict = {p: [] for p in points}
        revisits: Counter = Counter()
        foreign_cores = []
        queue = deque(visits)
        measure_started = time.perf_counter()
        with Progress(console=console) as progress:
            task = progress.add_task("decode shapes", total=len(queue))
            while queue:
                point = queue.popleft()
                with ForeignLoad([os.getpid(), worker.proc.pid]) as load:
                    sample = profiler.measure(point)
                foreign_cores.append(load.cores)
                progress.advance(task)
                can_revisit = revisits[point] < config.max_revisits and revisits.total() < len(visits) // 2
                if load.cores > config.max_foreign_cores and can_revisit:
                    # Another job shared the cores: this visit says little about the device. Later, not now:
                    # such jobs run for seconds to minutes.
                    revisits[point] += 1
                    queue.append(point)
                    progress.update(task, total=progress.tasks[0].total + 1)
                    continue
                measured[point].append(sample)
        measure_s = time.perf_counter() - measure_started
        pick = VISIT_STATISTICS[config.statistic]
        for point in points:
            (held_out if point.is_held_out else fit).append(pick(measured[point]))
        if config.co_run:
            co_run_rates = co_run_rates_by_ft(read_stats(worker.admin_url)["colocation"]["co_run"])
    finally:
        worker.stop()
    finetune = None
    throughput = ()
    if config.finetune:
        from harvest.profiler.finetune_profiler import FinetuneProfiler

        with console.status(f"measuring the finetune job alone ({config.finetune}) ..."):
            finetune = FinetuneProfiler(config.finetune, config.finetune_steps, config.finetune_max_unit_ms,
                                        device.finetune_device).measure(grid.num_sms)
        throughput = (finetune.throughput,)
        if config.co_run:
            throughput = _co_run_throughput(config, device, co_run_rates, console) + throughput
    samples_path = out.with_suffix(".samples.csv")
    held_out_path = out.with_suffix(".held_out.csv")
    write_samples(samples_path, fit)
    write_samples(held_out_path, held_out)
    # Every visit, so another statistic can be tried on the same measurements.
    for path, is_held_out in ((samples_path, False), (held_out_path, True)):
        write_samples(path.with_suffix(".visits.csv"),
                      [v for p in points if p.is_held_out == is_held_out for v in measured[p]])
    is_embedded = config.model_path in (None, EMBEDDED_MODEL_PLACEHOLDER)
    profile = Profile.build(fit, grid, device_name=device.name,
                            model=EMBEDDED_MODEL_PLACEHOLDER if is_embedded else recorded_path(model_path),
                            finetune_config_id=recorded_path(config.finetune) if config.finetune else "none",
                            samples_path=recorded_path(samples_path), held_out=held_out,
                            finetune_throughput=throughput)
    profile.save(out)
    ratios = profiler.latency_to_interval
    summary = {
        "profile": str(out),
        "host": {"cpu": cpu_model_name(), "num_cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2)},
        "device": device.name,
        "grid": str(grid),
        "dropped_partitions": [list(p) for p in dropped_partitions],
        "num_fit_samples": len(fit),
        "num_held_out_samples": len(held_out),
        "num_visits": len(foreign_cores),
        "num_disturbed_visits": sum(revisits.values()),
        "foreign_cores_p50": round(statistics.median(foreign_cores), 3),
        "statistic": config.statistic,
        "dtype": config.dtype,
        "worker_log": str(worker.log_path),
        "startup_s": round(startup_s, 1),
        "measure_s": round(measure_s, 1),
        "finetune_s": round(finetune.setup_s + finetune.measure_s, 1) if finetune else None,
        "finetune_foreign_cores": round(finetune.foreign_cores, 3) if finetune else None,
        "total_s": round(time.perf_counter() - started, 1),
        "step_latency_over_interval_p50": round(statistics.median(ratios), 3) if ratios else None,
        "plateau_batch_size": profile.latency_model.solo.plateau_batch_size,
        "fit_metrics": profile.to_dict()["fit_metrics"],
        "finetune_throughput": [t.to_dict() for t in throughput] or None,
    }
    return summary


WORKER_FLAGS = (
    # Both schedules would mis-time or mis-pair steps: on a CPU the overlap scheduler's step records span two
    # forwards (decode_profiler.py); on a GPU it launches step n+1 (the controller's before_step) before
    # step n's result is processed (after_step), which takes back the co-run units just handed to n+1 and
    # charges n's co-run to n+1's partition (controller.py pairs before_step(n) with after_step(n)).
    # harvest serve turns it off by itself only with a job (launcher.py); a solo profile runs none.
    "--disable-overlap-schedule",
    # Token ids in, token ids out: no grammar to build (the GPU bundle leaves xgrammar out, bundle_builder.py).
    "--grammar-backend", "none",
)

CO_RUN_UNIT_MS = 20.0
"""Unit bound of a co-run profile when --finetune-max-unit-ms is not given: the co-run rate depends on it."""


def _co_run_flags(config: LiveProfileConfig, grid) -> list[str]:
    """A spatial worker pinned per visit (DecodeProfiler._pin), starting on the whole device; without a
    profile it forms every partition its device forms (runtime._spatial_partitions). A 1 ms target leaves no
    temporal slice, so only co-run units run beside the measured steps; no KV lending, so the pool is the
    solo one's. On a GPU every decode partition of the grid gets a graph set up to the largest batch measured,
    so a visit replays graphs as a served step does (a CPU worker has no graphs and ignores both flags)."""
    if not config.co_run:
        return []
    unit_ms = config.finetune_max_unit_ms or CO_RUN_UNIT_MS
    num_decode_partitions = len({infer for infer, _ in grid.pairs()})
    return ["--finetune", str(config.finetune), "--tpot-slo-ms", "1", "--pin-partition", f"{grid.num_sms},0",
            "--no-kv-lending", "--finetune-max-unit-ms", str(unit_ms),
            "--partition-graph-sets", str(num_decode_partitions), "--partition-graph-max-bs",
            str(config.max_batch_size)]


def _wait_for_job(admin_url: str, timeout_s: float = 600.0) -> None:
    ready = ("running", "waiting", "starved", "paused")
    stats = wait_for_stats(admin_url, lambda s: s["finetune"]["state"] in (*ready, "finished", "stopped"),
                           "the finetune job to be built", timeout_s)
    state = stats["finetune"]["state"]
    if state not in ready:
        raise HarvestError(f"the finetune job {state} before co-run profiling: see the worker log")


def co_run_rates_by_ft(co_run_stats: dict) -> dict[int, float]:
    """Co-run finetune tokens/s per finetune partition size, from the worker's per-partition totals
    (SpatialController.stats()["co_run"]: "infer,ft" -> tokens, ms_granted: the time the job held the
    partition, running units back to back). A profile keeps one rate per ft_sms
    (FinetuneThroughput), so partitions with the same finetune side and different decode sides pool their
    tokens and time; a partition that trained nothing (the job was paused there: solo visits) adds none."""
    totals: dict[int, list[float]] = {}
    for key, row in co_run_stats.items():
        if row["tokens"] and row["ms_granted"]:
            total = totals.setdefault(int(key.split(",")[1]), [0.0, 0.0])
            total[0] += row["tokens"]
            total[1] += row["ms_granted"]
    return {ft: tokens / ms * 1e3 for ft, (tokens, ms) in sorted(totals.items())}


def _co_run_throughput(config: LiveProfileConfig, device, co_run_rates: dict[int, float], console) -> tuple:
    """Per finetune partition size the job co-ran on: its solo rate (the job alone on those units) and the
    co-run rate the worker measured beside decode."""
    from harvest.profiler.finetune_profiler import FinetuneProfiler

    contexts = {ft: (lambda ft=ft: device.finetune_context(ft)) for ft in co_run_rates}
    with console.status(f"measuring the finetune job alone on {len(contexts)} finetune partitions ..."):
        solo = FinetuneProfiler(config.finetune, config.finetune_steps, config.finetune_max_unit_ms or CO_RUN_UNIT_MS,
                                device.finetune_device).measure_partitions(contexts)
    return tuple(FinetuneThroughput(ft, solo[ft].throughput.tokens_per_s_solo, rate, solo[ft].throughput.unit_ms,
                                    solo[ft].throughput.samples_per_s_solo) for ft, rate in co_run_rates.items())
