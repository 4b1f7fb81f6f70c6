"""How much the host charges for work that crosses cores, beside work that does not: (1) a thread ping-pong
(harvest/bench/host_probe.py's, 2000 of them: a futex wake-up across cores, as an interpreter lock hand-off is);
(2) a decode-like loop of small float32 matmuls with torch on one thread and on two (OpenMP: a barrier across
cores per op). Prints one JSON line of medians. Run from the checkout: .venv/bin/python <this>."""
import json
import os
import statistics
import time

import torch

from harvest.bench.host_probe import ping_pong_us

cores = sorted(os.sched_getaffinity(0))[:2]
ws = [torch.randn(576, 1536) for _ in range(30)]
x = torch.randn(1, 576)


def loop_ms(threads: int) -> float:
    torch.set_num_threads(threads)
    times = []
    with torch.no_grad():
        for _ in range(40):
            started = time.perf_counter()
            for w in ws:
                (x @ w).sum()
            times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times[5:])


result = {"ping_pong_us": ping_pong_us(cores[0], cores[1], num=2000), "loop_ms_1_thread": round(loop_ms(1), 3),
          "loop_ms_2_threads": round(loop_ms(2), 3)}
result["two_thread_speedup"] = round(result["loop_ms_1_thread"] / result["loop_ms_2_threads"], 2)
print(json.dumps({"time": time.strftime("%H:%M:%S"), **result}))
