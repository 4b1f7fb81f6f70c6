"""The demo job's units (uncut) on core 1, run by the main thread or by a second thread of the process (the
worker's unit thread is one; glibc gives it another malloc arena): tok/s, on-CPU share, minor page faults/s.
20 s phases alternated twice. From the repository root:

    python eval/results/cpu-2026-11-28/slow-host/arena.py 20
"""
import json
import resource
import sys
import threading
import time

from harvest.colocation.core_partitions import on_cores
from harvest.finetune import FinetuneEngine

PHASE_S = float(sys.argv[1]) if len(sys.argv) > 1 else 20.0
engine = FinetuneEngine.from_yaml("harvest/finetune/demo/demo.yaml", overrides={"max_steps": 10**6, "save_steps": 10**9})

def phase(out):
    with on_cores([1]):
        r0 = resource.getrusage(resource.RUSAGE_THREAD); t0 = time.perf_counter(); c0 = time.thread_time(); tokens = 0
        while time.perf_counter() - t0 < PHASE_S:
            tokens += engine.run_next_unit().num_trained_tokens
        el = time.perf_counter() - t0; r1 = resource.getrusage(resource.RUSAGE_THREAD)
        out.update(tokens_per_s=round(tokens / el, 2), minflt_per_s=round((r1.ru_minflt - r0.ru_minflt) / el),
                   on_cpu=round((time.thread_time() - c0) / el, 3), sys_share=round((r1.ru_stime - r0.ru_stime) / el, 3))

with on_cores([1]):
    for _ in range(30):
        engine.run_next_unit()
runs = []
for rep in range(2):
    for where in ("main", "thread"):
        out = {"repeat": rep, "where": where}
        if where == "main":
            phase(out)
        else:
            t = threading.Thread(target=phase, args=(out,)); t.start(); t.join()
        runs.append(out); print(out, file=sys.stderr, flush=True)
print(json.dumps(runs))
