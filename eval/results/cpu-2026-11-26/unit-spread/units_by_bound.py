"""The demo job on both cores (torch 2 threads), units cut to a bound: tokens/s over N optimizer steps after 2
warm-up steps, per unit kind (count, mean ms, max ms, how many ran over the bound), and the optimizer update per step (its grad_norm,
optimizer and checkpoint units summed: mean, max ms). Run from a checkout's root (PYTHONPATH=. for another
checkout than the installed one):
    python eval/results/cpu-2026-11-26/optimizer-parts/units_by_bound.py 18.6 8     # bound (or none), N
"""
import collections
import json
import sys
import time

import torch

from harvest.finetune import FinetuneConfig, FinetuneEngine

bound = None if sys.argv[1] == "none" else float(sys.argv[1])
if len(sys.argv) > 3:  # the unit sizer's spread quantile: "off" (sized to the line alone) or its Z
    from harvest.finetune import unit_sizer
    if sys.argv[3] == "off":
        unit_sizer.MIN_SPREAD_SAMPLES = 10**9
    else:
        unit_sizer.SPREAD_Z = float(sys.argv[3])
torch.set_num_threads(2)
yaml_path = "harvest/finetune/demo/demo.yaml"
e = FinetuneEngine.from_yaml(yaml_path, config=FinetuneConfig(yaml_path=yaml_path, max_unit_ms=bound),
                             overrides={"max_steps": 10**6, "save_steps": 10**9})
for _ in range(2):
    e.run_step()
count, total, longest, tokens = collections.Counter(), collections.Counter(), collections.Counter(), 0
over = collections.Counter()
t0 = time.perf_counter()
num_steps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
update_ms = []
for _ in range(num_steps):
    update_ms.append(0.0)
    while True:
        r = e.run_next_unit()
        count[r.kind] += 1
        total[r.kind] += r.duration_ms
        longest[r.kind] = max(longest[r.kind], r.duration_ms)
        over[r.kind] += bound is not None and r.duration_ms > bound
        tokens += r.num_trained_tokens
        if r.kind in ("grad_norm", "optimizer", "checkpoint"):
            update_ms[-1] += r.duration_ms
        if r.is_step_end:
            break
elapsed = time.perf_counter() - t0
print(json.dumps({"bound_ms": bound, "tokens_per_s": round(tokens / elapsed, 1), "loss": e.stats()["loss"],
                  "steps": num_steps,
                  "update_ms": {"mean": round(sum(update_ms) / num_steps, 1), "max": round(max(update_ms), 1)},
                  "units": {k: {"n": count[k], "mean_ms": round(total[k] / count[k], 1),
                                "max_ms": round(longest[k], 1), "over": over[k]} for k in count},
                  "over_bound": f"{sum(over.values())} of {sum(count.values())}",
                  "over_bound_pct": round(100 * sum(over.values()) / sum(count.values()), 2),
                  "spread": sys.argv[3] if len(sys.argv) > 3 else "n/a"}))
