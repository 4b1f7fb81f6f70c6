"""`harvest bench warmup`: each unit kind's first unit after the engine is built, with and without the engine's
warm-up (FinetuneConfig.warm_up_units), side by side.

A first run's one-time work is the process's, so every run is a fresh process: the engine is built, then runs
`--steps` optimizer steps with its units cut to the bound, and each kind's first unit (the one a worker would
run on the decode path) is set against the median of the later steps' first units of the kind (like for like: a
step's first embed also reads the step's batches). The two settings alternate round by
round; two rounds give each setting twice, the A/A control of how far a first unit moves between like runs.

Deferred imports: each bench imports its machinery (torch, SGLang, the replay) when it runs, not when `harvest bench`
lists it.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from harvest.bench import device_name
from harvest.bench.units import _config_path, _parse_bound

RESULT_PREFIX = "warmup-run: "


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="LlamaFactory YAML (default: the demo YAML on the embedded SmolLM2)")
    parser.add_argument("--tiny", action="store_true", help="use the tiny random Llama job instead (seconds)")
    parser.add_argument("--bound-ms", default="18.6",
                        help="the unit bound in ms, or none (default 18.6, as `harvest bench units`)")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps per run (default 4)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each setting, alternating (default 2)")
    parser.add_argument("--num-threads", type=int, default=2, help="torch CPU threads (default 2)")


def run(args: argparse.Namespace) -> dict:
    bound = _parse_bound(args.bound_ms)
    if args.steps < 2 or args.rounds < 1:
        raise SystemExit("--steps must be >= 2 (a first step and later ones) and --rounds >= 1")
    runs = []
    with tempfile.TemporaryDirectory(prefix="harvest-bench-warmup-") as work_dir:
        config_path = _config_path(args, Path(work_dir))
        for round_id in range(args.rounds):
            for warm_up in (False, True) if round_id % 2 == 0 else (True, False):
                runs.append({"round": round_id, **_run_process(config_path, warm_up, bound, args.steps,
                                                               args.num_threads)})
    summary = {setting: _first_over_p50(r for r in runs if r["warm_up"] == is_on)
               for setting, is_on in (("off", False), ("on", True))}
    warmup_ms = [r["warmup_ms"] for r in runs if r["warm_up"]]
    worst_on = max(summary["on"].values())
    worst_off = max(summary["off"].values())
    verdict = (f"with the warm-up a kind's first unit is at most {worst_on:.2f}x the later steps' median "
               f"(without: {worst_off:.2f}x); the warm-up took {statistics.median(warmup_ms):.0f} ms while the "
               "engine was built")
    return {"device": device_name(True), "config": str(config_path), "num_threads": args.num_threads,
            "bound_ms": bound, "steps": args.steps, "runs": runs, "first_over_p50": summary,
            "aa_first_ms_ratio": _aa_ratios(runs), "verdict": verdict}


def print_result(result: dict, console) -> None:
    from rich.table import Table

    kinds = list(result["first_over_p50"]["off"])
    table = Table(title=f"harvest bench warmup ({result['device']}, {result['steps']} steps a run, "
                        f"{result['num_threads']} threads): a kind's first unit over the later steps' median")
    for column in ("round", "warm-up", "warm-up ms", *kinds):
        table.add_column(column, justify="right")
    for r in result["runs"]:
        cells = [f"{r['kinds'][k]['first_ms'] / r['kinds'][k]['p50_ms']:.2f}x" if k in r["kinds"] else "-"
                 for k in kinds]
        table.add_row(str(r["round"]), "on" if r["warm_up"] else "off",
                      "-" if r["warmup_ms"] is None else f"{r['warmup_ms']:.0f}", *cells)
    for setting in ("off", "on"):
        table.add_row("median", setting, "", *[f"{result['first_over_p50'][setting][k]:.2f}x" for k in kinds])
    console.print(table)
    console.print(f"A/A, first unit ms of like runs (larger / smaller): {result['aa_first_ms_ratio']}")
    console.print(f"verdict: {result['verdict']}")


def _run_process(config_path: Path, warm_up: bool, bound: float | None, steps: int, num_threads: int) -> dict:
    code = (f"from harvest.bench.warmup import _one_run; _one_run({str(config_path)!r}, {warm_up}, {bound}, "
            f"{steps}, {num_threads})")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "LLAMAFACTORY_VERBOSITY": "WARN"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=1800)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"harvest bench warmup: a run exited with {done.returncode}: {tail}")
    return json.loads(lines[-1][len(RESULT_PREFIX):])


def _one_run(config_path: str, warm_up: bool, bound: float | None, steps: int, num_threads: int) -> None:
    """One run, in its own process: prints its result on one line."""
    import torch

    from harvest.finetune import FinetuneConfig, FinetuneEngine

    torch.set_num_threads(num_threads)
    with tempfile.TemporaryDirectory(prefix="harvest-bench-warmup-run-") as output_dir:
        engine = FinetuneEngine.from_yaml(
            config_path, config=FinetuneConfig(max_unit_ms=bound, warm_up_units=warm_up),
            overrides={"max_steps": 10**6, "save_steps": 10**9, "output_dir": output_dir})
        times: dict[str, list[float]] = {}  # kind -> its first unit's time in each step
        for _ in range(steps):
            in_step = set()
            while True:
                unit = engine.run_next_unit()
                if unit.kind not in in_step:
                    in_step.add(unit.kind)
                    times.setdefault(unit.kind, []).append(unit.duration_ms)
                if unit.is_step_end:
                    break
    kinds = {kind: {"first_ms": round(ms[0], 3), "p50_ms": round(statistics.median(ms[1:]), 3), "n": len(ms)}
             for kind, ms in times.items() if len(ms) > 1}
    result = {"warm_up": warm_up, "warmup_ms": None if engine.warmup_ms is None else round(engine.warmup_ms, 3),
              "warmup_unit_ms": {k: round(ms, 3) for k, ms in engine.warmup_unit_ms.items()}, "kinds": kinds}
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def _first_over_p50(runs) -> dict[str, float]:
    """Per kind, the median over runs of its first unit's time over the later steps' median."""
    ratios: dict[str, list[float]] = {}
    for r in runs:
        for kind, t in r["kinds"].items():
            ratios.setdefault(kind, []).append(t["first_ms"] / t["p50_ms"])
    return {kind: round(statistics.median(values), 2) for kind, values in ratios.items()}


def _aa_ratios(runs: list[dict]) -> dict[str, dict[str, float]]:
    """Per setting and kind, the larger over the smaller first unit of its first two runs (1.0: alike)."""
    out = {}
    for setting, is_on in (("off", False), ("on", True)):
        like = [r for r in runs if r["warm_up"] == is_on][:2]
        if len(like) == 2:
            out[setting] = {kind: round(max(a, b) / min(a, b), 2)
                            for kind in like[0]["kinds"] if kind in like[1]["kinds"]
                            for a, b in [(like[0]["kinds"][kind]["first_ms"], like[1]["kinds"][kind]["first_ms"])]}
    return out
