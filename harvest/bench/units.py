"""`harvest bench units`: the finetune engine alone with its units cut to a bound, side by side with other bounds.

What a bound costs and what it buys: tokens/s over N optimizer steps after the warm-up steps, and per unit kind
how many units ran, their mean and longest time and how many ran over the bound (a pause waits for the unit in
flight, so the bound is the reaction the worker can promise). The bounds alternate round by round in one
process, so the host's drift falls on all of them alike; `none` (units uncut) is the rate the bound is paid
against, and the same bound twice is the A/A control. The update (grad_norm, optimizer and checkpoint units)
is also summed per step. The sizer aims to keep 99 % of units within the bound (UnitSizer's spread factor).

Deferred imports: each bench imports its machinery (torch, SGLang, the replay) when it runs, not when `harvest bench`
lists it.
"""

import argparse
import collections
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from harvest.bench import device_name

UPDATE_KINDS = ("grad_norm", "optimizer", "checkpoint")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="LlamaFactory YAML (default: the demo YAML on the embedded SmolLM2)")
    parser.add_argument("--tiny", action="store_true", help="use the tiny random Llama job instead (seconds)")
    parser.add_argument("--bound-ms", action="append", default=None,
                        help="a unit bound in ms, or none (repeatable; default: 18.6 and none; 18.6 ms is the "
                             "shipped core profile's shortest decode step, the bound `harvest serve --profile` sets)")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps timed per run (default 8)")
    parser.add_argument("--warmup-steps", type=int, default=2, help="optimizer steps before timing (default 2)")
    parser.add_argument("--rounds", type=int, default=1, help="run every bound this many times, alternating")
    parser.add_argument("--num-threads", type=int, default=2, help="torch CPU threads (default 2)")


def run(args: argparse.Namespace) -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("LLAMAFACTORY_VERBOSITY", "WARN")
    import torch

    from harvest.finetune.unit_sizer import SPREAD_Z

    bounds = [_parse_bound(b) for b in (args.bound_ms or ["18.6", "none"])]
    torch.set_num_threads(args.num_threads)
    runs = []
    with tempfile.TemporaryDirectory(prefix="harvest-bench-units-") as work_dir:
        config_path = _config_path(args, Path(work_dir))
        for round_id in range(args.rounds):
            for bound in bounds if round_id % 2 == 0 else bounds[::-1]:
                runs.append({"round": round_id, **_run(config_path, bound, args.warmup_steps, args.steps)})
    aim_pct = 100 * (1 - statistics.NormalDist().cdf(SPREAD_Z))
    bounded = [r for r in runs if r["bound_ms"] is not None]
    worst = max((r["over_bound_pct"] for r in bounded), default=None)
    verdict = ("no bound given" if worst is None else
               f"{'meets' if worst <= aim_pct else 'misses'} the sizer's aim: at most {worst:.2f} % of units "
               f"over the bound in any run, against {aim_pct:.1f} %")
    return {"device": device_name(True), "config": str(config_path), "num_threads": args.num_threads,
            "steps": args.steps, "warmup_steps": args.warmup_steps, "aim_over_bound_pct": round(aim_pct, 2),
            "runs": runs, "verdict": verdict}


def print_result(result: dict, console) -> None:
    from rich.table import Table

    table = Table(title=f"harvest bench units ({result['device']}, {result['steps']} steps after "
                        f"{result['warmup_steps']}, {result['num_threads']} threads)")
    for column in ("round", "bound ms", "tok/s", "units over the bound", "head units over",
                   "longest unit ms", "update per step mean / max ms"):
        table.add_column(column, justify="right")
    for r in result["runs"]:
        head = r["units"].get("head", {"n": 0, "over": 0})
        table.add_row(str(r["round"]), "none" if r["bound_ms"] is None else f"{r['bound_ms']:g}",
                      f"{r['tokens_per_s']:.1f}",
                      f"{r['over_bound']} of {r['num_units']} ({r['over_bound_pct']:.2f} %)",
                      f"{head['over']} of {head['n']}", f"{r['longest_unit_ms']:.1f}",
                      f"{r['update_ms']['mean']:.1f} / {r['update_ms']['max']:.1f}")
    console.print(table)
    console.print(f"verdict: {result['verdict']}")


def _parse_bound(text: str) -> float | None:
    if text == "none":
        return None
    try:
        bound = float(text)
    except ValueError:
        raise SystemExit(f"--bound-ms: {text!r} is neither a number of ms nor none") from None
    if bound <= 0:
        raise SystemExit(f"--bound-ms: {text} must be > 0")
    return bound


def _config_path(args: argparse.Namespace, work_dir: Path) -> Path:
    if args.tiny:
        from harvest.finetune.demo.tiny_job import write_tiny_job

        return write_tiny_job(work_dir, num_layers=2)
    path = Path(args.config or Path(__file__).parents[1] / "finetune" / "demo" / "demo.yaml")
    if not path.is_file():
        raise SystemExit(f"--config: {path} is not a file")
    return path


def _run(config_path: Path, bound: float | None, warmup_steps: int, steps: int) -> dict:
    from harvest.finetune import FinetuneConfig, FinetuneEngine

    with tempfile.TemporaryDirectory(prefix="harvest-bench-units-run-") as output_dir:
        with contextlib.redirect_stdout(sys.stderr):  # LlamaFactory prints a training example: stdout is the JSON
            engine = FinetuneEngine.from_yaml(
                config_path, config=FinetuneConfig(yaml_path=str(config_path), max_unit_ms=bound),
                overrides={"max_steps": 10**6, "save_steps": 10**9, "output_dir": output_dir})
        for _ in range(warmup_steps):
            engine.run_step()
        count, total_ms, longest_ms, over = (collections.Counter() for _ in range(4))
        update_ms, tokens = [], 0
        started = time.perf_counter()
        for _ in range(steps):
            update_ms.append(0.0)
            while True:
                unit = engine.run_next_unit()
                count[unit.kind] += 1
                total_ms[unit.kind] += unit.duration_ms
                longest_ms[unit.kind] = max(longest_ms[unit.kind], unit.duration_ms)
                over[unit.kind] += bound is not None and unit.duration_ms > bound
                tokens += unit.num_trained_tokens
                if unit.kind in UPDATE_KINDS:
                    update_ms[-1] += unit.duration_ms
                if unit.is_step_end:
                    break
        elapsed_s = time.perf_counter() - started
        num_units = sum(count.values())
        return {"bound_ms": bound, "tokens_per_s": round(tokens / elapsed_s, 2), "num_tokens": tokens,
                "loss": engine.stats()["loss"], "num_units": num_units, "over_bound": sum(over.values()),
                "over_bound_pct": round(100 * sum(over.values()) / num_units, 2),
                "longest_unit_ms": round(max(longest_ms.values()), 1),
                "update_ms": {"mean": round(statistics.fmean(update_ms), 1), "max": round(max(update_ms), 1)},
                "units": {kind: {"n": count[kind], "mean_ms": round(total_ms[kind] / count[kind], 1),
                                 "max_ms": round(longest_ms[kind], 1), "over": over[kind]} for kind in count}}
