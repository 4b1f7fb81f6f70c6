"""The demo job on both cores (torch 2 threads), units cut to a bound: tokens/s over 3 optimizer steps after 2
warm-up steps, and per unit kind (count, mean ms). Run from the repository root:
    python eval/results/cpu-2026-11-25/unit-sizer/units_by_bound.py 18.6     # or 50, 75, none
"""
import sys, time, collections, torch
from harvest.finetune import FinetuneEngine, FinetuneConfig
bound = None if sys.argv[1] == "none" else float(sys.argv[1])
torch.set_num_threads(2)
e = FinetuneEngine.from_yaml("harvest/finetune/demo/demo.yaml", config=FinetuneConfig(yaml_path="harvest/finetune/demo/demo.yaml", max_unit_ms=bound), overrides={"max_steps": 10**6, "save_steps": 10**9})
for _ in range(2): e.run_step()
cnt, ms, tok = collections.Counter(), collections.Counter(), 0
t0 = time.perf_counter()
for _ in range(3):
    while True:
        r = e.run_next_unit(); cnt[r.kind] += 1; ms[r.kind] += r.duration_ms; tok += r.num_trained_tokens
        if r.is_step_end: break
el = time.perf_counter() - t0
print("bound", bound, "tok/s %.1f" % (tok / el), {k: (cnt[k], round(ms[k] / cnt[k], 1)) for k in cnt})
