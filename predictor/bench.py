"""`harvest bench predictor`: time SplitPlanner.plan, the per-decode-step decision (HARLI: 5 us).

Without --profile, the profile is the SYNTHETIC H100 one (predictor/synthetic_profile.py: 132 SMs in
groups of 8, 16 inference partitions, 120 co-run candidates) fitted here, so the timing covers the
largest candidate set harvest plans over; the result says whether its profile was synthetic. decision_us_mean (plan only) and plan_and_observe_us_mean (a
step's whole decision cost: plan, then observe the measured latency) divide a loop's time by its steps, in
the least disturbed of NUM_REPEATS loops (the timeit convention: slower repeats measure other processes
on shared cores, not the planner); the plain mean over all repeats and the host's load sit beside it.
The percentiles time each call alone, so they include one perf_counter_ns pair (~0.1 us).
"""

import argparse
import os
import random
import statistics
import time

from predictor.profile import Profile
from predictor.split_planner import SplitPlanner
from predictor.synthetic_profile import build_synthetic_profile, is_synthetic

HARLI_DECISION_US = 5.0
NUM_REPEATS = 10


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", help="profile JSON to plan with (default: a synthetic H100 profile)")
    parser.add_argument("--tpot-ms", type=float, default=30.0, help="TPOT SLO the planner targets")
    parser.add_argument("--num-decisions", type=int, default=200_000)
    parser.add_argument("--max-batch-size", type=int, default=256)
    parser.add_argument("--max-seq-len", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> dict:
    fit_s = None
    if args.profile:
        profile = Profile.load(args.profile)
    else:
        start = time.perf_counter()
        profile = build_synthetic_profile(args.seed, args.max_batch_size, args.max_seq_len)
        fit_s = time.perf_counter() - start
    planner = SplitPlanner(profile, args.tpot_ms)
    rng = random.Random(args.seed)
    shapes = [
        (rng.randint(1, args.max_batch_size), rng.randint(1, args.max_seq_len), rng.random() < 0.9) for _ in range(4096)
    ]
    n = max(args.num_decisions, len(shapes))
    plan = planner.plan
    for b, s, r in shapes:
        plan(b, s, r)
    repeat_means_us = []
    for _ in range(NUM_REPEATS):
        start = time.perf_counter()
        for k in range(n // NUM_REPEATS):
            b, s, r = shapes[k & 4095]
            plan(b, s, r)
        repeat_means_us.append((time.perf_counter() - start) / (n // NUM_REPEATS) * 1e6)
    per_call_ns = []
    clock = time.perf_counter_ns
    for k in range(n):
        b, s, r = shapes[k & 4095]
        t0 = clock()
        plan(b, s, r)
        per_call_ns.append(clock() - t0)
    per_call_ns.sort()
    decisions = [plan(b, s, r) for b, s, r in shapes]
    # A step's whole decision cost: plan, then observe its measured latency (the profile 10 % slow with
    # 5 % noise, so the correction, the margin and the rows keep moving as on a real device).
    measured = [1.1 * rng.lognormvariate(0.0, 0.05) for _ in range(4096)]
    observe = planner.observe
    repeat_pair_us = []
    for _ in range(NUM_REPEATS):
        start = time.perf_counter()
        for k in range(n // NUM_REPEATS):
            b, s, r = shapes[k & 4095]
            d = plan(b, s, r)
            observe(d, d.model_ms * measured[k & 4095])
        repeat_pair_us.append((time.perf_counter() - start) / (n // NUM_REPEATS) * 1e6)
    return {
        "decision_us_mean": min(repeat_means_us),
        "decision_us_mean_all_repeats": statistics.fmean(repeat_means_us),
        "decision_us_p50": per_call_ns[n // 2] / 1e3,
        "decision_us_p99": per_call_ns[int(0.99 * (n - 1))] / 1e3,
        "harli_reported_us": HARLI_DECISION_US,
        "num_candidates": planner.num_candidates,
        "num_decisions": n,
        "fraction_co_run": sum(d.ft_sms > 0 for d in decisions) / len(decisions),
        "plan_and_observe_limit_us": HARLI_DECISION_US,
        "plan_and_observe_us_mean": min(repeat_pair_us),
        "plan_and_observe_us_mean_all_repeats": statistics.fmean(repeat_pair_us),
        "profile": _describe(args.profile, profile),
        "profile_is_synthetic": is_synthetic(profile),
        "profile_device": profile.device_name,
        "finetune_rates": planner.rate_source,
        "fit_s": fit_s,
        "host_num_cpus": os.cpu_count(),
        "host_load_avg_1m": os.getloadavg()[0],
    }


def _describe(path: str | None, profile: Profile) -> str:
    if path is None:
        return "SYNTHETIC: fitted here to predictor.SyntheticDevice (no device measured)"
    if is_synthetic(profile):
        return f"SYNTHETIC: {path} ({profile.device_name})"
    return f"{path} ({profile.device_name})"

