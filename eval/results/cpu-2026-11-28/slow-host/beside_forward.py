"""The demo job's units (uncut) on core 1, in a second thread, beside a forward of the served model (SmolLM2-135M,
6 x 8 tokens, HF transformers) looped on core 0 by the main thread of the same process, as the worker's
scheduler decodes beside its unit thread: nothing, the forward in float16, in float32. 20 s phases, twice.
From the repository root:

    python eval/results/cpu-2026-11-28/slow-host/beside_forward.py
"""
import json
import resource
import sys
import threading
import time

import torch
from transformers import AutoModelForCausalLM

from harvest.colocation.core_partitions import on_cores
from harvest.finetune import FinetuneEngine
from harvest.models import resolve_model_path

PHASE_S = 20.0
engine = FinetuneEngine.from_yaml("harvest/finetune/demo/demo.yaml", overrides={"max_steps": 10**6, "save_steps": 10**9})
path = str(resolve_model_path(None))
models = {dt: AutoModelForCausalLM.from_pretrained(path, torch_dtype=dt).eval() for dt in (torch.float16, torch.float32)}
ids = torch.randint(3, 1000, (6, 8))

def units(out, stop):
    with on_cores([1]):
        r0 = resource.getrusage(resource.RUSAGE_THREAD); t0 = time.perf_counter(); c0 = time.thread_time(); tok = 0
        while time.perf_counter() - t0 < PHASE_S:
            tok += engine.run_next_unit().num_trained_tokens
        el = time.perf_counter() - t0; r1 = resource.getrusage(resource.RUSAGE_THREAD)
        out.update(tokens_per_s=round(tok / el, 2), on_cpu=round((time.thread_time() - c0) / el, 3),
                   minflt_per_s=round((r1.ru_minflt - r0.ru_minflt) / el))
    stop.set()

with on_cores([1]):
    for _ in range(30):
        engine.run_next_unit()
runs = []
for rep in range(2):
    for load in ("alone", "fp16", "fp32"):
        out, stop = {"repeat": rep, "load": load}, threading.Event()
        t = threading.Thread(target=units, args=(out, stop)); t.start()
        steps = 0
        with on_cores([0]), torch.no_grad():
            while not stop.is_set():
                if load == "alone":
                    time.sleep(0.05)
                else:
                    models[torch.float16 if load == "fp16" else torch.float32](ids); steps += 1
        t.join(); out["decode_steps"] = steps; runs.append(out); print(out, file=sys.stderr, flush=True)
print(json.dumps(runs))
