"""What the host charges for work that crosses cores, and for work on one, probed as a bench row begins (no worker
busy), so the row can be read against the host it ran on. On a shared VM both drift within the hour
(eval/results/cpu-2026-11-29/slow-host/), and the first is what an in-process co-location pays for and a
two-process split does not: an interpreter-lock hand-off between the scheduler thread and the unit thread on
the other core is such a wake-up, and decode on the whole device meets an OpenMP barrier per op.

Deferred imports: torch when probed (`harvest bench` lists its benches without it).
"""

import os
import statistics
import threading
import time

from harvest.colocation.core_partitions import on_cores

PING_PONGS = 500
LOOPS = 30


def probe_host() -> dict:
    """{"ping_pong_us": a thread's wake-up of a thread on another core and back (None on one core),
    "decode_loop_ms": {threads: a decode-like loop of small ops with Python between them}} (medians)."""
    import torch

    cores = sorted(os.sched_getaffinity(0))
    before_threads = torch.get_num_threads()
    try:
        loop_ms = {n: _decode_loop_ms(n) for n in sorted({1, min(2, len(cores))})}
    finally:
        torch.set_num_threads(before_threads)
    return {"ping_pong_us": ping_pong_us(cores[0], cores[1]) if len(cores) > 1 else None,
            "decode_loop_ms": loop_ms}


def ping_pong_us(here: int, there: int, num: int = PING_PONGS) -> float:
    """The median us for a thread on core `here` to wake one on core `there` and be woken back."""
    ping, pong = threading.Event(), threading.Event()

    def echo() -> None:
        os.sched_setaffinity(threading.get_native_id(), [there])
        for _ in range(num):
            ping.wait()
            ping.clear()
            pong.set()

    times = []
    with on_cores([here]):
        thread = threading.Thread(target=echo, name="harvest-host-probe", daemon=True)
        thread.start()
        for _ in range(num):
            started = time.perf_counter()
            ping.set()
            pong.wait()
            pong.clear()
            times.append((time.perf_counter() - started) * 1e6)
        thread.join()
    return round(statistics.median(times), 1)


def _decode_loop_ms(threads: int) -> float:
    """Thirty small matmuls with Python between them, as a small model's decode step is on a CPU."""
    import torch

    torch.set_num_threads(threads)
    weights = [torch.randn(576, 1536) for _ in range(LOOPS)]
    x = torch.randn(2, 576)
    times = []
    with torch.no_grad():
        for _ in range(LOOPS):
            started = time.perf_counter()
            for w in weights:
                y = x @ w
                (y[:, :576] * 2).sum()
            times.append((time.perf_counter() - started) * 1e3)
    return round(statistics.median(times[3:]), 3)
