"""Does a compiled layer unit hold the interpreter lock while its fused kernels run, and does inductor's C++
wrapper (which releases it for the whole graph) give a decode thread of the same process its time back?
One decoder layer of the demo job (4 rows x 96 positions) on core 1, one torch thread, its three units (forward
without autograd, recompute with it, backward) back to back, beside a decode-like thread (HF SmolLM2, batch 8, KV
cache, gil_probe.py's) on core 0: decode's steps/s with no units, eager units, compiled units (inductor's Python
wrapper: each fused C++ kernel is called with the lock held) and compiled with `cpp_wrapper` (one C++ call per
graph, the lock released inside). Also: the share of its wall time the decode thread was on a core.
Run from the repository root: .venv/bin/python eval/results/cpu-2026-11-29/gil-release/gil_release_probe.py"""
import contextlib, json, multiprocessing as mp, os, sys, tempfile, threading, time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "partition-gap"))
from gil_probe import decode_loop  # noqa: E402

PHASE_S = 12.0


def main():
    from harvest.finetune import FinetuneConfig, FinetuneEngine
    from harvest.finetune.decoder_units import RowSlice
    from harvest.bench.host_probe import probe_host
    host = probe_host()
    print(json.dumps({"host": host}), flush=True)
    os.sched_setaffinity(threading.get_native_id(), [1]); torch.set_num_threads(1)
    cfg = Path("harvest/finetune/demo/demo.yaml").resolve()
    with contextlib.redirect_stdout(sys.stderr):
        engine = FinetuneEngine.from_yaml(cfg, config=FinetuneConfig(yaml_path=str(cfg)),
            overrides={"max_steps": 10**6, "save_steps": 10**9, "output_dir": tempfile.mkdtemp()})
    engine.run_step()
    units = engine.units
    ids = torch.randint(0, 1000, (4, 96))
    row = RowSlice(inputs={"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids},
                   loss_denominator=torch.tensor(384.0), num_tokens=384)
    units.embed(row)
    layer = units.layers[0]
    hidden0 = row.hidden[0]
    kwargs = dict(attention_mask=row.causal_mask, position_ids=row.position_ids,
                  position_embeddings=row.position_embeddings)

    def run_layer(h):
        out = layer(h, **kwargs)
        return out[0] if isinstance(out, tuple) else out

    def units_of(fn):
        def three():
            with torch.no_grad():
                fn(hidden0)
            h = hidden0.detach().requires_grad_(True)
            with torch.enable_grad():
                out = fn(h)
            torch.autograd.backward(out, torch.ones_like(out))
        return three

    modes = {"eager": units_of(run_layer)}
    compile_s = {}
    for name, options in (("compiled", {}), ("compiled_cpp_wrapper", {"cpp_wrapper": True})):
        torch._dynamo.reset()
        fn = units_of(torch.compile(run_layer, dynamic=True, options=options))
        started = time.perf_counter()
        for _ in range(3):
            fn()
        compile_s[name] = round(time.perf_counter() - started, 1)
        modes[name] = fn
    print(json.dumps({"compile_s": compile_s}), flush=True)

    stop, steps = threading.Event(), mp.Value("l", 0)
    decoder = threading.Thread(target=decode_loop, args=(stop, steps, [0]))
    decoder.start()
    while steps.value < 5:
        time.sleep(0.05)
    tid = decoder.native_id
    runs = []
    for rnd in range(3):
        for name in ("none", "eager", "compiled", "compiled_cpp_wrapper"):
            s0, t0, cpu0 = steps.value, time.perf_counter(), _thread_cpu_s(tid)
            reps = 0
            while time.perf_counter() - t0 < PHASE_S:
                if name == "none":
                    time.sleep(0.05)
                else:
                    modes[name](); reps += 1
            wall = time.perf_counter() - t0
            entry = {"round": rnd, "units": name, "decode_steps_per_s": round((steps.value - s0) / wall, 2),
                     "decode_on_cpu": round((_thread_cpu_s(tid) - cpu0) / wall, 3),
                     "unit_ms_per_layer": round(wall / reps * 1e3, 1) if reps else None}
            runs.append(entry); print(json.dumps(entry), flush=True)
    stop.set(); decoder.join()
    print(json.dumps({"host": host, "compile_s": compile_s, "phase_s": PHASE_S, "runs": runs}))


def _thread_cpu_s(tid: int) -> float:
    with open(f"/proc/self/task/{tid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


if __name__ == "__main__":
    main()
