"""`harvest replay`: replay a request trace live against a running worker, or simulate it per policy."""

import argparse
import json
import re
import time
from pathlib import Path

from harvest.errors import HarvestError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*(ms|s|m|min|h)?\s*$")
_UNIT_S = {None: 1.0, "s": 1.0, "ms": 1e-3, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_duration_s(text: str, flag: str) -> float:
    match = _DURATION.match(text)
    if not match:
        raise HarvestError(f"{flag} {text!r} is not a duration (600s, 10m, 1h or a number of seconds)")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "replay",
        help="replay a request trace, live against `harvest serve` or simulated per policy",
        description="Replay a trace (shipped: conv, code; a CSV TIMESTAMP,ContextTokens,GeneratedTokens; or "
        "poisson:rate=5,duration=600,seed=0 / gamma:rate=5,cv=3,duration=600,seed=0) either live against a "
        "running `harvest serve` (--target) or as a discrete-event simulation of the decode worker driven by a "
        "latency profile (--simulate). Writes DIR/results.json and PNG plots, and prints a comparison table.",
    )
    parser.add_argument("--trace", required=True, help="conv, code, a CSV path, or a synthetic spec")
    parser.add_argument("--window", default=None, help="replay only this long a stretch, e.g. 600s or 10m")
    parser.add_argument("--window-start", default="0", help="where the window starts in the trace (default 0)")
    parser.add_argument("--rate-scale", type=float, default=1.0, help="arrive k times as fast (default 1)")
    parser.add_argument("--max-context-tokens", type=int, default=None, help="cap each request's context")
    parser.add_argument("--max-generated-tokens", type=int, default=None, help="cap each request's output")
    parser.add_argument("--out", required=True, help="output folder for results.json and the plots")
    parser.add_argument("--tpot-ms", type=float, default=40.0, help="TPOT target in ms (default 40, as HARLI)")
    parser.add_argument("--no-plots", action="store_true", help="write results.json only")
    live = parser.add_argument_group("live mode")
    live.add_argument("--target", default=None, help="URL of a running `harvest serve` (SGLang port)")
    live.add_argument("--admin", default="http://127.0.0.1:30100", help="its admin URL (default :30100)")
    live.add_argument("--concurrency", type=int, default=64, help="most requests in flight (default 64)")
    live.add_argument(
        "--drain-s",
        type=float,
        default=300.0,
        help="wait this long after the last arrival, then cancel what is unfinished (default 300)",
    )
    sim = parser.add_argument_group("simulated mode")
    sim.add_argument("--simulate", action="store_true", help="simulate instead of sending requests")
    sim.add_argument(
        "--profile",
        default=None,
        help="latency profile JSON (default: the shipped SYNTHETIC H100 profile, not measured)",
    )
    sim.add_argument("--policy", default="all", choices=["separate", "static", "harvest", "temporal", "oracle", "all"])
    sim.add_argument("--with-oracle", action="store_true",
                     help="also run the oracle: per step the best candidate with the device's true latency")
    sim.add_argument(
        "--memory", default=None, help="device memory preset (h100-llama3-8b; cpu-smollm2-135m; default by profile)"
    )
    sim.add_argument("--kv-capacity-tokens", type=int, default=None, help="override the KV pool size")
    sim.add_argument("--static-share", type=float, default=0.6, help="static's decode share (default 0.6)")
    sim.add_argument("--max-running-requests", type=int, default=256)
    sim.add_argument(
        "--latency-noise",
        type=float,
        default=0.0,
        help="log-normal sigma between profile and simulated device (default 0: exact)",
    )
    sim.add_argument(
        "--plan-margin", type=float, default=0.0,
        help="override: harvest and temporal plan for target * (1 - margin) (default 0: temporal plans for the "
        "target, harvest learns its margin online)"
    )
    sim.add_argument("--seed", type=int, default=0)
    parser.set_defaults(func=run)


def load_replay_trace(args: argparse.Namespace):
    from traces.trace_loader import load_trace

    trace = load_trace(args.trace)
    if args.window is not None or args.window_start != "0":
        duration = None if args.window is None else parse_duration_s(args.window, "--window")
        trace = trace.window(parse_duration_s(args.window_start, "--window-start"), duration)
    trace = trace.scale_rate(args.rate_scale)
    if args.max_context_tokens is not None or args.max_generated_tokens is not None:
        trace = trace.cap_lengths(args.max_context_tokens, args.max_generated_tokens)
    return trace


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from harvest.replay.comparison_table import print_comparison

    if bool(args.target) == bool(args.simulate):
        raise HarvestError("give exactly one of --target URL (live) and --simulate (with --profile)")
    console = Console(stderr=True)
    trace = load_replay_trace(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results = _simulate(args, trace, console) if args.simulate else _live(args, trace, console)
    results["trace"].update(
        spec=args.trace,
        window=args.window,
        window_start=args.window_start,
        rate_scale=args.rate_scale,
        max_context_tokens=args.max_context_tokens,
        max_generated_tokens=args.max_generated_tokens,
    )
    results["wall_s"] = round(time.perf_counter() - started, 3)
    path = out / "results.json"
    path.write_text(json.dumps(results, indent=1, allow_nan=False) + "\n")
    print_comparison(results, Console(width=None if console.is_terminal else 160))
    written = [path]
    if not args.no_plots:
        from harvest.replay.replay_plots import write_plots

        written += write_plots(results, out)
    console.print(f"wrote {', '.join(str(p) for p in written)} ({results['wall_s']:.1f} s)")
    return 0


def _simulate(args: argparse.Namespace, trace, console) -> dict:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from harvest.replay.replay_config import POLICIES, DeviceMemory, ReplayConfig
    from harvest.replay.replay_simulation import ReplaySimulation
    from harvest.replay.synthetic_profile import SHIPPED_PATH
    from predictor import Profile

    profile_path = args.profile or str(SHIPPED_PATH)
    profile = Profile.load(profile_path)
    preset = args.memory or ("cpu-smollm2-135m" if profile.num_sms == 1 else "h100-llama3-8b")
    memory = DeviceMemory.from_name(preset).with_kv_capacity(args.kv_capacity_tokens)
    config = ReplayConfig(
        tpot_slo_ms=args.tpot_ms,
        policies=(POLICIES if args.policy == "all" else (args.policy,)) + (("oracle",) if args.with_oracle else ()),
        static_infer_share=args.static_share,
        max_running_requests=args.max_running_requests,
        latency_noise=args.latency_noise,
        plan_margin=args.plan_margin,
        seed=args.seed,
    )
    simulation = ReplaySimulation(profile, memory, config, profile_path)
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

        return simulation.run(trace, on_progress)


def _live(args: argparse.Namespace, trace, console) -> dict:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from harvest.replay.live_replay import LiveReplay

    replay = LiveReplay(
        args.target, args.admin, args.tpot_ms, args.concurrency, drain_s=args.drain_s
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
