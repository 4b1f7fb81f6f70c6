"""How much the host charges for work that crosses cores, beside work that does not: (1) a thread ping-pong
(threading.Event, the waker on one core, the waiter on the other: a futex wake-up across cores, as a GIL hand-off
is); (2) a decode-like loop of small float32 matmuls with torch on one thread and on two (OpenMP: a barrier across
cores per op). Prints one JSON line of medians. Run from the checkout: .venv/bin/python <this>."""
import json
import os
import statistics
import threading
import time

import torch

cores = sorted(os.sched_getaffinity(0))[:2]


def ping_pong_us(n: int = 2000) -> float:
    ping, pong = threading.Event(), threading.Event()
    times = []

    def echo():
        os.sched_setaffinity(threading.get_native_id(), [cores[1]])
        for _ in range(n):
            ping.wait()
            ping.clear()
            pong.set()

    os.sched_setaffinity(threading.get_native_id(), [cores[0]])
    thread = threading.Thread(target=echo)
    thread.start()
    for _ in range(n):
        started = time.perf_counter()
        ping.set()
        pong.wait()
        pong.clear()
        times.append((time.perf_counter() - started) * 1e6)
    thread.join()
    os.sched_setaffinity(threading.get_native_id(), cores)
    return statistics.median(times)


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


result = {"ping_pong_us": round(ping_pong_us(), 1), "loop_ms_1_thread": round(loop_ms(1), 3),
          "loop_ms_2_threads": round(loop_ms(2), 3)}
result["two_thread_speedup"] = round(result["loop_ms_1_thread"] / result["loop_ms_2_threads"], 2)
print(json.dumps({"time": time.strftime("%H:%M:%S"), **result}))
