"""One `harvest replay` run: load and shape the trace, replay it live or simulated, write results and plots.

Deferred imports: the job trace writer and the plots (matplotlib) only where a run writes them.
"""

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from base.errors import HarvestError
from harvest.fleet.round_policy import RoundPolicy
from harvest.replay.comparison_table import print_comparison
from harvest.replay.fleet_replay import DEFAULT_ROUND_S, FleetReplay
from harvest.replay.fleet_sync_cost import SyncCost
from harvest.replay.job_replay import JobReplay
from harvest.replay.job_trace import load_jobs
from harvest.replay.live_replay import LiveReplay
from harvest.replay.recorded_device import Recording
from harvest.replay.replay_config import POLICIES, DeviceMemory, ReplayConfig
from harvest.replay.replay_simulation import ReplaySimulation
from predictor import Profile
from predictor.synthetic_profile import SHIPPED_PATH
from traces.trace_loader import load_trace

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*(ms|s|m|min|h)?\s*$")
_UNIT_S = {None: 1.0, "s": 1.0, "ms": 1e-3, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_duration_s(text: str, flag: str) -> float:
    match = _DURATION.match(text)
    if not match:
        raise HarvestError(f"{flag} {text!r} is not a duration (600s, 10m, 1h or a number of seconds)")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


@dataclass(frozen=True, slots=True)
class ReplayRunConfig:
    """One `harvest replay` run, as its flags give it (see `harvest replay --help` for each)."""

    trace: str
    out: str
    window: str | None = None
    window_start: str = "0"
    rate_scale: float = 1.0
    max_context_tokens: int | None = None
    max_generated_tokens: int | None = None
    tpot_ms: float = 40.0
    no_plots: bool = False
    target: str | None = None
    admin: str = "http://127.0.0.1:30100"
    concurrency: int = 64
    drain_s: float = 300.0
    simulate: bool = False
    profile: str | None = None
    policy: str = "all"
    with_oracle: bool = False
    memory: str | None = None
    kv_capacity_tokens: int | None = None
    static_share: float = 0.6
    max_running_requests: int = 256
    latency_noise: float = 0.0
    recording: str | None = None
    plan_margin: float = 0.0
    seed: int = 0
    jobs: str | None = None
    job_switch_s: float = 2.0
    job_restart_s: float = 60.0
    decode_workers: str | None = None
    fleet_load: str = "round-robin"
    fleet_round_tokens: int | None = None
    fleet_round_s: float | None = None
    fleet_link_gbps: float | None = None
    fleet_round_latency_ms: float | None = None
    fleet_adapter_bytes: int | None = None


def load_replay_trace(config: ReplayRunConfig):
    trace = load_trace(config.trace)
    if config.window is not None or config.window_start != "0":
        duration = None if config.window is None else parse_duration_s(config.window, "--window")
        trace = trace.window(parse_duration_s(config.window_start, "--window-start"), duration)
    trace = trace.scale_rate(config.rate_scale)
    if config.max_context_tokens is not None or config.max_generated_tokens is not None:
        trace = trace.cap_lengths(config.max_context_tokens, config.max_generated_tokens)
    return trace


def load_job_replay(config: ReplayRunConfig):
    """--jobs, checked before anything runs: the trace read (or the synthetic spec parsed) and the flags it needs."""
    if config.jobs is None:
        return None
    if not config.simulate:
        raise HarvestError("--jobs needs --simulate (a live replay's jobs are submitted to the worker)")
    if config.policy not in ("all", "harvest"):
        raise HarvestError(f"--jobs runs the harvest policy's controller: give --policy harvest or all, not {config.policy}")
    if config.recording is not None:
        raise HarvestError("--jobs with --recording: a recording's units are one job's; drop one of the two")
    for flag, value in (("--job-switch-s", config.job_switch_s), ("--job-restart-s", config.job_restart_s)):
        if not value >= 0:
            raise HarvestError(f"{flag} {value} must be >= 0")
    return JobReplay(load_jobs(config.jobs), config.jobs, config.job_switch_s, config.job_restart_s)


def load_device(config: ReplayRunConfig):
    """(profile path, profile, memory) of a simulated replay."""
    profile_path = config.profile or str(SHIPPED_PATH)
    profile = Profile.load(profile_path)
    memory = DeviceMemory.for_profile(profile, config.memory).with_kv_capacity(config.kv_capacity_tokens)
    return profile_path, profile, memory


def load_fleet_replay(config: ReplayRunConfig):
    """--decode-workers, checked before anything runs; None without it."""
    if config.decode_workers is None:
        given = [flag for flag, value in (("--fleet-round-tokens", config.fleet_round_tokens),
                                          ("--fleet-round-s", config.fleet_round_s),
                                          ("--fleet-link-gbps", config.fleet_link_gbps),
                                          ("--fleet-round-latency-ms", config.fleet_round_latency_ms),
                                          ("--fleet-adapter-bytes", config.fleet_adapter_bytes)) if value is not None]
        if given or config.fleet_load != "round-robin":
            raise HarvestError(f"{given[0] if given else '--fleet-load'} needs --decode-workers: the fleet it configures")
        return None
    if not config.simulate:
        raise HarvestError("--decode-workers needs --simulate (a live fleet is `harvest bench fleet`)")
    try:
        sizes = tuple(int(n) for n in config.decode_workers.split(","))
    except ValueError:
        raise HarvestError(f"--decode-workers must be N or N,N,... (whole numbers), got {config.decode_workers!r}") \
            from None
    if config.policy not in ("all", "harvest"):
        raise HarvestError(f"--decode-workers runs the harvest policy: give --policy harvest or all, not {config.policy}")
    for flag, given in (("--recording", config.recording), ("--jobs", config.jobs)):
        if given is not None:
            raise HarvestError(f"--decode-workers with {flag}: the fleet simulates one job on the profile's units; "
                               "drop one of the two")
    is_default = config.fleet_round_tokens is None and config.fleet_round_s is None
    policy = RoundPolicy(config.fleet_round_tokens, DEFAULT_ROUND_S if is_default else config.fleet_round_s)
    cost = SyncCost.for_memory(load_device(config)[2].name, config.fleet_adapter_bytes, config.fleet_link_gbps,
                               config.fleet_round_latency_ms)
    return FleetReplay(sizes, config.fleet_load, policy, cost)


def run_replay(config: ReplayRunConfig, console) -> tuple[dict, list[Path]]:
    """Replay, write results.json and the plots, print the comparison; returns the results and what was written."""
    if bool(config.target) == bool(config.simulate):
        raise HarvestError("give exactly one of --target URL (live) and --simulate (with --profile)")
    jobs = load_job_replay(config)
    fleet = load_fleet_replay(config)
    trace = load_replay_trace(config)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results = _simulate(config, trace, console, jobs, fleet) if config.simulate else _live(config, trace, console)
    results["trace"].update(
        spec=config.trace,
        window=config.window,
        window_start=config.window_start,
        rate_scale=config.rate_scale,
        max_context_tokens=config.max_context_tokens,
        max_generated_tokens=config.max_generated_tokens,
    )
    results["wall_s"] = round(time.perf_counter() - started, 3)
    path = out / "results.json"
    path.write_text(json.dumps(results, indent=1, allow_nan=False) + "\n")
    print_comparison(results, Console(width=None if console.is_terminal else 160))
    written = [path]
    if not config.no_plots:
        from harvest.replay.replay_plots import write_plots

        written += write_plots(results, out)
    return results, written


def _simulate(config: ReplayRunConfig, trace, console, jobs=None, fleet=None) -> dict:
    profile_path, profile, memory = load_device(config)
    console.print(f"memory preset {memory.name}: {memory.basis}")
    replay_config = ReplayConfig(
        tpot_slo_ms=config.tpot_ms,
        policies=(POLICIES if config.policy == "all" else (config.policy,)) + (("oracle",) if config.with_oracle else ()),
        static_infer_share=config.static_share,
        max_running_requests=config.max_running_requests,
        latency_noise=config.latency_noise,
        plan_margin=config.plan_margin,
        seed=config.seed,
    )
    recording = None if config.recording is None else Recording.load(config.recording)
    simulation = ReplaySimulation(profile, memory, replay_config, profile_path, recording)
    span_s = max(trace.duration_s, 1e-9)
    with Progress(
        TextColumn("simulating {task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task("", total=simulation.num_device_runs() * span_s)
        state = {"done": 0.0, "last": 0.0}

        def on_progress(policy: str, t_s: float) -> None:
            if t_s < state["last"]:
                state["done"] += state["last"]
            state["last"] = min(t_s, span_s)
            progress.update(task, completed=state["done"] + state["last"], description=policy)

        results = simulation.run(trace, on_progress, jobs, fleet,
                                 lambda n, s: console.print(f"fleet of {n}: simulated in {s:.1f} s"))
    if jobs is not None:
        from harvest.replay.job_trace import JobArrival, write_job_trace

        write_job_trace([JobArrival(**a) for a in results["jobs"]["arrivals"]], Path(config.out) / "job_trace.jsonl")
    return results


def _live(config: ReplayRunConfig, trace, console) -> dict:
    replay = LiveReplay(
        config.target, config.admin, config.tpot_ms, config.concurrency, drain_s=config.drain_s
    )
    with Progress(
        TextColumn("replaying live"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task("", total=trace.num_requests)
        return replay.run(trace, lambda i: progress.advance(task))
