"""The demo job's units back to back on core 1, one torch thread, for DURATION s (py-spy attaches meanwhile);
HV_SPEC=1: floats specialized in its compiled layers. Run from the repository root."""
import contextlib, json, os, sys, tempfile, threading, time
from pathlib import Path
import torch
DURATION = float(sys.argv[1]) if len(sys.argv) > 1 else 40
def main():
    from harvest.finetune import FinetuneConfig, FinetuneEngine
    if os.environ.get("HV_SPEC"): torch._dynamo.config.specialize_float = True
    os.sched_setaffinity(0, [1]); torch.set_num_threads(1)
    cfg = Path("harvest/finetune/demo/demo.yaml").resolve()
    with contextlib.redirect_stdout(sys.stderr):
        engine = FinetuneEngine.from_yaml(cfg, config=FinetuneConfig(yaml_path=str(cfg), max_unit_ms=75.0, compile_layers=True, compile_thread_counts=(1,)),
            overrides={"max_steps": 10**6, "save_steps": 10**9, "output_dir": tempfile.mkdtemp()})
    for _ in range(2): engine.run_step()
    print(json.dumps({"ready": os.getpid(), "stats": engine.units.compiled.stats() if engine.units.compiled else engine.units.eager_reason}), flush=True)
    n, tokens, started = 0, 0, time.perf_counter()
    while time.perf_counter() - started < DURATION:
        r = engine.run_next_unit(); n += 1; tokens += r.num_trained_tokens
    wall = time.perf_counter() - started
    print(json.dumps({"units": n, "units_per_s": round(n / wall, 2), "tokens_per_s": round(tokens / wall, 2),
                      "compiled": engine.units.compiled.stats() if engine.units.compiled else None}), flush=True)
main()
