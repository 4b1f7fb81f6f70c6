"""The three ABBA runs' table: finetune tok/s and steps in 300 ms per cell, each tree's four... two runs and mean.
Usage (from this folder): python3 summary.py"""
import json
from collections import defaultdict

VARIANTS = [("line-only", "9d2bacb"), ("larger-batches", "77e2492"), ("partition-all-steps", "28d782b")]
for variant, rev in VARIANTS:
    cells = defaultdict(list)
    for run in ("new-1", "old-1", "old-2", "new-2"):
        for r in json.load(open(f"{variant}-{run}.json"))["runs"]:
            tree = rev if run.startswith("new") else "bbfee76"
            cells[(r["window"], r["row"], tree)].append((r["finetune_tokens_per_s"], 100 * r["steps_within_target"]))
    print(f"## {variant}: {rev} against bbfee76")
    for (window, row, tree), runs in sorted(cells.items()):
        tok = [t for t, _ in runs]
        print(f"| {window} | {row} | {tree} | {', '.join(f'{t:.1f}' for t in tok)} | {sum(tok) / len(tok):.1f} | "
              f"{', '.join(f'{a:.2f}' for _, a in runs)} |")
