"""fp16 decode-like loop (SmolLM2-135M shapes) on both cores: plain, inside on_cores(all cores) per iteration, and after a
set_num_threads per iteration. Run from the checkout: .venv/bin/python <this> [float16|float32]. Prints medians (ms)."""
import sys, time, statistics, json, os
import torch

from harvest.colocation.core_partitions import on_cores
dt = getattr(torch, sys.argv[1]) if len(sys.argv) > 1 else torch.float16
torch.manual_seed(0)
layers = [(torch.randn(576, 576*3, dtype=dt), torch.randn(576, 576, dtype=dt), torch.randn(576, 1536*2, dtype=dt), torch.randn(1536, 576, dtype=dt)) for _ in range(30)]
x = torch.randn(1, 576, dtype=dt)
def step():
    t = time.perf_counter()
    with torch.no_grad():
        h = x
        for a, b, c, d in layers:
            q = h @ a
            h = h + q[:, :576] @ b
            g = h @ c
            h = h + (torch.nn.functional.silu(g[:, :1536]) * g[:, 1536:]) @ d
    return (time.perf_counter() - t) * 1e3
cores = sorted(os.sched_getaffinity(0))
res = {"plain": [], "on_cores": [], "set_num_threads": []}
for _ in range(5): step()
for i in range(60):
    res["plain"].append(step())
    with on_cores(cores):
        res["on_cores"].append(step())
    torch.set_num_threads(len(cores)); res["set_num_threads"].append(step())
print(json.dumps({k: round(statistics.median(v), 2) for k, v in res.items()}), dt, torch.get_num_threads())
