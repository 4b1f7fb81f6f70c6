"""The demo job on both cores (torch 2 threads), units cut to a bound: tokens/s over 3 optimizer steps after 2
warm-up steps, and per unit kind (count, mean ms, max ms). Run from a checkout's root (PYTHONPATH=. for
another checkout than the installed one):
    python eval/results/cpu-2026-11-25/head-vocab-chunks/units_by_bound.py 18.6     # or 75, none
"""
import collections
import json
import sys
import time

import torch

from harvest.finetune import FinetuneConfig, FinetuneEngine

bound = None if sys.argv[1] == "none" else float(sys.argv[1])
torch.set_num_threads(2)
yaml_path = "harvest/finetune/demo/demo.yaml"
e = FinetuneEngine.from_yaml(yaml_path, config=FinetuneConfig(yaml_path=yaml_path, max_unit_ms=bound),
                             overrides={"max_steps": 10**6, "save_steps": 10**9})
for _ in range(2):
    e.run_step()
count, total, longest, tokens = collections.Counter(), collections.Counter(), collections.Counter(), 0
t0 = time.perf_counter()
for _ in range(3):
    while True:
        r = e.run_next_unit()
        count[r.kind] += 1
        total[r.kind] += r.duration_ms
        longest[r.kind] = max(longest[r.kind], r.duration_ms)
        tokens += r.num_trained_tokens
        if r.is_step_end:
            break
elapsed = time.perf_counter() - t0
print(json.dumps({"bound_ms": bound, "tokens_per_s": round(tokens / elapsed, 1), "loss": e.stats()["loss"],
                  "units": {k: {"n": count[k], "mean_ms": round(total[k] / count[k], 1),
                                "max_ms": round(longest[k], 1)} for k in count}}))
