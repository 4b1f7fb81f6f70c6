"""A decode-like loop of small parallel ops (Python between them) on the whole device, alone and beside another
thread that made an OpenMP team of its own. Run from the checkout: .venv/bin/python <this> VARIANT, VARIANT one of
none, other1 (the other thread ran a parallel op with one thread), other2 (with two: a team), other2_then1 (two, then
one), other2_exit (two, and the thread ended). Prints the loop's median ms."""
import json
import statistics
import sys
import threading
import time

import torch

from harvest.colocation.core_partitions import on_cores

variant = sys.argv[1]
ws = [torch.randn(576, 1536) for _ in range(30)]
x = torch.randn(2, 576)


def decode():
    t = time.perf_counter()
    with torch.no_grad():
        for w in ws:
            y = x @ w
            for _ in range(20):
                pass  # Python between ops, as in a forward
            (y[:, :576] * 2).sum()
    return (time.perf_counter() - t) * 1e3


def other():
    if variant == "other1":
        with on_cores([1]):
            (torch.randn(256, 576) @ ws[0]).sum()
    elif variant.startswith("other2"):
        (torch.randn(256, 576) @ ws[0]).sum()
    if variant == "other2_then1":
        with on_cores([1]):
            (torch.randn(256, 576) @ ws[0]).sum()
    if variant == "other2_exit":
        return
    time.sleep(120)


if variant != "none":
    threading.Thread(target=other, daemon=True).start()
    time.sleep(1)
with on_cores([0, 1]):
    for _ in range(20):
        decode()
    print(json.dumps({"variant": variant, "decode_ms": round(statistics.median(decode() for _ in range(100)), 3)}))
