"""Does a second Python thread in the process slow the finetune units, as the decode worker's scheduler thread
would? The demo job's units run on core 1 (one torch thread) for PHASE_S each, while on core 0 another thread
of the same process does: nothing ("alone"), a pure-Python loop that holds the GIL ("python"), or a decode-like
loop of small one-thread matmuls with Python between them ("torch"). Phases alternate, twice (A/A spread).

    python eval/results/cpu-2026-11-25/gil/gil_experiment.py > eval/results/cpu-2026-11-25/gil/gil_experiment.json
    SWITCH_INTERVAL_S=0.0005 python ... > gil_experiment_switch_0.5ms.json   # Python's GIL hand-over interval

Ran 2026-11-25 01:08-01:13 UTC at 981cf07. Since 2026-11-26 it pins threads with the worker's own public
`harvest.colocation.core_partitions.on_cores` (it imported the private helper before); the measurement is the same.
"""

import json
import os
import sys
import threading
import time

import torch

from harvest.colocation.core_partitions import on_cores
from harvest.finetune import FinetuneEngine

DEMO = "harvest/finetune/demo/demo.yaml"
PHASE_S = 20.0


def python_loop(stop):
    while not stop.is_set():
        sum(range(1000))


def torch_loop(stop):
    torch.set_num_threads(1)
    a, b = torch.randn(64, 576), torch.randn(576, 576)
    while not stop.is_set():
        for _ in range(30):  # ~one decode step of a 30-layer model's small GEMMs, Python in between
            a = torch.tanh(a @ b) * 0.5


LOADS = {"alone": None, "python": python_loop, "torch": torch_loop}


def phase(engine, load) -> dict:
    stop = threading.Event()
    other = None
    if load is not None:
        def pinned():
            with on_cores([0]):
                load(stop)
        other = threading.Thread(target=pinned, daemon=True)
        other.start()
    tokens, units, started = 0, 0, time.perf_counter()
    with on_cores([1]):
        while time.perf_counter() - started < PHASE_S:
            result = engine.run_next_unit()
            tokens += result.num_trained_tokens
            units += 1
    elapsed = time.perf_counter() - started
    stop.set()
    if other is not None:
        other.join()
    return {"tokens_per_s": tokens / elapsed, "units": units, "s": elapsed}


def main() -> None:
    if os.environ.get("SWITCH_INTERVAL_S"):
        sys.setswitchinterval(float(os.environ["SWITCH_INTERVAL_S"]))
    engine = FinetuneEngine.from_yaml(DEMO, overrides={"max_steps": 10**6, "save_steps": 10**9})
    with on_cores([1]):
        for _ in range(30):  # warm-up: the first unit of each kind
            engine.run_next_unit()
    runs = []
    for repeat in range(2):
        for name, load in LOADS.items():
            runs.append({"repeat": repeat, "load": name, **phase(engine, load)})
            print(runs[-1], file=sys.stderr)
    print(json.dumps({"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(),
                      "switch_interval_s": sys.getswitchinterval(), "phase_s": PHASE_S, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
