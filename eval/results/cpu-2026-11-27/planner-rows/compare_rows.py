"""Decision cost of SplitPlanner with named rows (this checkout) against the tuple rows of BASE_REF, side by
side in one process, with an A/A control on each side.

usage (from the repository root): PYTHONPATH=. python eval/results/cpu-2026-11-27/planner-rows/compare_rows.py [BASE_REF]

BASE_REF's predictor/split_planner.py (`git show`) is loaded as its own module next to this checkout's, and
each is loaded twice (main, main' and rows, rows': the same code under two module objects, the A/A control).
The four planners run the same shapes (and, for plan + observe, the same measured latencies, so their state
moves alike), in chunks of CHUNK steps, in an order rotated every round so host drift falls on all four. Per
round, each planner's us per step; the ratios are per round (rows / main, main' / main, rows' / rows), their
median over rounds is reported. Before timing, every decision of the two implementations is checked equal.
"""

import importlib.util
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import predictor.split_planner
from predictor import Profile

PROFILE = Path("predictor/profiles/synthetic-h100-llama3-8b.json")
TPOT_MS = 40.0
CHUNK = 2000
ROUNDS = 40


def load(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SplitPlanner


def fields(decision) -> tuple:
    return (decision.infer_sms, decision.ft_sms, decision.predicted_ms, decision.slack_ms,
            decision.finetune_tokens_per_s, decision.margin, decision.is_finetune_paused,
            decision.is_slo_unreachable, decision.model_ms, decision.alone_ms)


def check_same(base, rows, profile, shapes, measured) -> int:
    """Every decision equal, through REFRESH_EVERY-spanning observe sequences; returns how many compared."""
    a, b = base(profile, TPOT_MS), rows(profile, TPOT_MS)
    for k in range(4 * len(shapes)):
        s = shapes[k % len(shapes)]
        da, db = a.plan(*s), b.plan(*s)
        assert fields(da) == fields(db), (k, s, da, db)
        a.observe(da, da.model_ms * measured[k % len(measured)])
        b.observe(db, db.model_ms * measured[k % len(measured)])
    return 4 * len(shapes)


def time_rounds(planners: dict, shapes, measured, with_observe: bool) -> dict[str, list[float]]:
    per_round = {name: [] for name in planners}
    position = dict.fromkeys(planners, 0)
    names = list(planners)
    clock = time.perf_counter
    for r in range(ROUNDS):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            planner = planners[name]
            plan, observe = planner.plan, planner.observe
            k0 = position[name]
            started = clock()
            if with_observe:
                for k in range(k0, k0 + CHUNK):
                    b, s, ready = shapes[k & 4095]
                    d = plan(b, s, ready)
                    observe(d, d.model_ms * measured[k & 4095])
            else:
                for k in range(k0, k0 + CHUNK):
                    b, s, ready = shapes[k & 4095]
                    plan(b, s, ready)
            per_round[name].append((clock() - started) / CHUNK * 1e6)
            position[name] += CHUNK
    return per_round


def summarize(per_round: dict[str, list[float]]) -> dict:
    def ratio(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(per_round[a], per_round[b], strict=True))

    return {
        "us_per_step_median": {n: round(statistics.median(v), 3) for n, v in per_round.items()},
        "us_per_step_min": {n: round(min(v), 3) for n, v in per_round.items()},
        "ratio_rows_to_main": round(ratio("rows", "main"), 4),
        "ratio_rows_prime_to_main_prime": round(ratio("rows'", "main'"), 4),
        "aa_main_prime_to_main": round(ratio("main'", "main"), 4),
        "aa_rows_prime_to_rows": round(ratio("rows'", "rows"), 4),
    }


def main() -> None:
    base_ref = sys.argv[1] if len(sys.argv) > 1 else "main"
    base_commit = subprocess.run(["git", "rev-parse", "--short", base_ref], capture_output=True, text=True,
                                 check=True).stdout.strip()
    source = subprocess.run(["git", "show", f"{base_ref}:predictor/split_planner.py"], capture_output=True,
                            text=True, check=True).stdout
    with tempfile.TemporaryDirectory() as tmp:
        base_path = os.path.join(tmp, "split_planner_base.py")
        Path(base_path).write_text(source)
        here = predictor.split_planner.__file__
        planner_classes = {"main": load("split_planner_base", base_path), "rows": load("split_planner_rows", here),
                           "main'": load("split_planner_base_2", base_path), "rows'": load("split_planner_rows_2", here)}
    profile = Profile.load(PROFILE)
    rng = random.Random(0)
    shapes = [(rng.randint(1, 256), rng.randint(1, 4096), rng.random() < 0.9) for _ in range(4096)]
    measured = [1.1 * rng.lognormvariate(0.0, 0.05) for _ in range(4096)]
    num_compared = check_same(planner_classes["main"], planner_classes["rows"], profile, shapes, measured)
    results = {}
    for mode, with_observe in (("plan", False), ("plan_and_observe", True)):
        planners = {name: cls(profile, TPOT_MS) for name, cls in planner_classes.items()}
        for name, planner in planners.items():  # warm up: every row and branch seen once
            for b, s, ready in shapes:
                planner.plan(b, s, ready)
        results[mode] = summarize(time_rounds(planners, shapes, measured, with_observe))
    out = {"base": f"{base_ref} ({base_commit}) predictor/split_planner.py", "rows": "this checkout",
           "profile": str(PROFILE), "tpot_ms": TPOT_MS, "chunk_steps": CHUNK, "rounds": ROUNDS,
           "decisions_compared_equal": num_compared, "python": platform.python_version(),
           "host_num_cpus": os.cpu_count(), "host_load_avg_1m": os.getloadavg()[0], **results}
    print(json.dumps(out))
    print(f"{'mode':<18}{'main us':>9}{'rows us':>9}{'rows/main':>11}{'AA main':>9}{'AA rows':>9}", file=sys.stderr)
    for mode in ("plan", "plan_and_observe"):
        r = results[mode]
        print(f"{mode:<18}{r['us_per_step_median']['main']:>9.3f}{r['us_per_step_median']['rows']:>9.3f}"
              f"{r['ratio_rows_to_main']:>11.4f}{r['aa_main_prime_to_main']:>9.4f}{r['aa_rows_prime_to_rows']:>9.4f}",
              file=sys.stderr)


if __name__ == "__main__":
    main()
