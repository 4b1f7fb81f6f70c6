"""Would compiled layer units shrink what the finetune engine pays beside a decode thread? One decoder layer of the
demo job (SmolLM2-135M with LoRA on every linear layer, 4 rows x 96 positions) on core 1, one torch thread: its
three units (forward without autograd, recompute with it, backward) repeated on fixed inputs, eager and under
torch.compile, each alone and beside a decode-like thread (HF SmolLM2, batch 8, KV cache) on core 0 of the same
process. Fixed work, so the times compare directly. Run from the repository root:
.venv/bin/python eval/results/cpu-2026-11-29/partition-gap/compile_probe.py"""
import contextlib, json, multiprocessing as mp, os, sys, tempfile, threading, time
from pathlib import Path

import torch

from gil_probe import decode_loop  # the same decode-like loop, on core 0 (this folder is the script's path)

REPS = 20


def main():
    from harvest.finetune import FinetuneConfig, FinetuneEngine
    from harvest.finetune.decoder_units import RowSlice
    os.sched_setaffinity(threading.get_native_id(), [1]); torch.set_num_threads(1)
    cfg = Path("harvest/finetune/demo/demo.yaml").resolve()
    with contextlib.redirect_stdout(sys.stderr):
        engine = FinetuneEngine.from_yaml(cfg, config=FinetuneConfig(yaml_path=str(cfg)),
            overrides={"max_steps": 10**6, "save_steps": 10**9, "output_dir": tempfile.mkdtemp()})
    engine.run_step()  # the window fetches every layer's frozen weights (placeholders until then)
    units = engine.units
    ids = torch.randint(0, 1000, (4, 96))
    row = RowSlice(inputs={"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids},
                   loss_denominator=torch.tensor(384.0), num_tokens=384)
    units.embed(row)
    layer = units.layers[0]
    hidden0 = row.hidden[0]
    kwargs = dict(attention_mask=row.causal_mask, position_ids=row.position_ids, position_embeddings=row.position_embeddings)

    def run_layer(h):
        out = layer(h, **kwargs)
        return out[0] if isinstance(out, tuple) else out

    def units_of(fn):
        def three():
            with torch.no_grad():
                fn(hidden0)                        # forward unit
            h = hidden0.detach().requires_grad_(True)
            with torch.enable_grad():
                out = fn(h)                        # recompute unit
            torch.autograd.backward(out, torch.ones_like(out))   # backward unit
        return three

    eager = units_of(run_layer)
    compiled_layer = torch.compile(run_layer, dynamic=False)
    compiled = units_of(compiled_layer)
    started = time.perf_counter()
    for _ in range(3):
        compiled()
    compile_s = time.perf_counter() - started
    for _ in range(3):
        eager()

    def timed(fn):
        t, c = time.perf_counter(), time.thread_time()
        for _ in range(REPS):
            fn()
        wall = time.perf_counter() - t
        return wall / REPS * 1e3, (time.thread_time() - c) / wall

    results = {"compile_s": round(compile_s, 1), "reps": REPS, "runs": []}
    for rnd in range(3):
        for beside in (False, True):
            stop, steps = threading.Event(), mp.Value("l", 0)
            if beside:
                th = threading.Thread(target=decode_loop, args=(stop, steps, [0])); th.start()
                while steps.value < 1:  # its first step done: the model loaded
                    time.sleep(0.01)
            for name, fn in (("eager", eager), ("compiled", compiled)):
                s0, t0 = steps.value, time.perf_counter()
                ms, on_cpu = timed(fn)
                rate = (steps.value - s0) / (time.perf_counter() - t0)
                entry = {"round": rnd, "units": name, "decode_thread": beside, "ms_per_layer_fwd_recompute_bwd": round(ms, 2),
                         "on_cpu": round(on_cpu, 3), "decode_steps_per_s": round(rate, 2)}
                results["runs"].append(entry); print(json.dumps(entry), flush=True)
            if beside:
                stop.set(); th.join()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
