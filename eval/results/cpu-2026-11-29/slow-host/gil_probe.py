"""Decode beside training on the other core: in one process (a second thread, as harvest's (1, 1) split) or in two
(as the pinned split). A decode-like loop (fp16 matmuls with Python between, one thread, core 0) is timed alone,
beside a thread of this process running a training-like loop (float32 matmuls forward and backward, one thread,
core 1), and beside a process running the same loop on core 1. Prints one JSON line of medians (ms).
Run from the checkout: .venv/bin/python <this>."""
import json
import multiprocessing as mp
import os
import statistics
import threading
import time

import torch


def train_loop(stop) -> None:
    os.sched_setaffinity(threading.get_native_id(), [1])
    torch.set_num_threads(1)
    w = torch.randn(576, 1536, requires_grad=True)
    x = torch.randn(64, 576)
    while not stop.is_set():
        for _ in range(8):
            (x @ w).relu().sum().backward()


def decode_ms(n: int = 40) -> float:
    os.sched_setaffinity(threading.get_native_id(), [0])
    torch.set_num_threads(1)
    ws = [torch.randn(576, 1536, dtype=torch.float16) for _ in range(30)]
    x = torch.randn(1, 576, dtype=torch.float16)
    times = []
    with torch.no_grad():
        for _ in range(n):
            started = time.perf_counter()
            for w in ws:
                y = x @ w
                for _ in range(20):
                    pass
                (y[:, :576] * 2).sum()
            times.append((time.perf_counter() - started) * 1e3)
    return round(statistics.median(times[3:]), 2)


if __name__ == "__main__":
    result = {"alone": decode_ms()}
    stop = threading.Event()
    thread = threading.Thread(target=train_loop, args=(stop,), daemon=True)
    thread.start()
    time.sleep(1)
    result["beside_a_thread"] = decode_ms()
    stop.set()
    thread.join()
    result["alone_again"] = decode_ms()
    stop = mp.get_context("spawn").Event()
    proc = mp.get_context("spawn").Process(target=train_loop, args=(stop,))
    proc.start()
    time.sleep(3)
    result["beside_a_process"] = decode_ms()
    stop.set()
    proc.join()
    print(json.dumps({"time": time.strftime("%H:%M:%S"), **result}))
