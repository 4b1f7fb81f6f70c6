"""What a decode loop beside the finetune engine costs it in one process: the engine's units on core 1 (the demo
job, units cut to 120 ms), timed over 6 optimizer steps with (a) nothing on core 0, (b) a decode-like loop (HF
SmolLM2 forward, batch 8, KV cache) in a thread of this process on core 0, (c) the same loop in a process of its
own on core 0; two rounds. Prints tok/s, the share of the time the engine's thread was on a core, decode steps/s.
Run from the repository root: .venv/bin/python eval/results/cpu-2026-11-29/partition-gap/gil_probe.py"""
import contextlib, multiprocessing as mp, os, sys, tempfile, threading, time
from pathlib import Path

def decode_loop(stop, counter, cores):
    import torch
    os.sched_setaffinity(threading.get_native_id(), cores); torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM
    from harvest.models import resolve_model_path
    model = AutoModelForCausalLM.from_pretrained(str(resolve_model_path(None)), torch_dtype=torch.float32).eval()
    ids = torch.randint(0, 1000, (8, 64))
    with torch.no_grad():
        while not stop.is_set():
            out = model(ids, use_cache=True); past = out.past_key_values
            nxt = out.logits[:, -1:].argmax(-1)
            for _ in range(64):
                if stop.is_set(): break
                out = model(nxt, past_key_values=past, use_cache=True); past = out.past_key_values
                nxt = out.logits[:, -1:].argmax(-1); counter.value += 1

def main():
    import torch
    from harvest.finetune import FinetuneConfig, FinetuneEngine
    os.sched_setaffinity(threading.get_native_id(), [1]); torch.set_num_threads(1)
    cfg = Path("harvest/finetune/demo/demo.yaml").resolve()
    with contextlib.redirect_stdout(sys.stderr):
        engine = FinetuneEngine.from_yaml(cfg, config=FinetuneConfig(yaml_path=str(cfg), max_unit_ms=120.0),
            overrides={"max_steps": 10**6, "save_steps": 10**9, "output_dir": tempfile.mkdtemp()})
    for _ in range(2): engine.run_step()
    def timed(steps=6):
        tokens, t, c = 0, time.perf_counter(), time.thread_time()
        for _ in range(steps):
            while True:
                r = engine.run_next_unit(); tokens += r.num_trained_tokens
                if r.is_step_end: break
        wall = time.perf_counter() - t
        return tokens / wall, (time.thread_time() - c) / wall
    results = {}
    for rnd in range(2):
        for mode in ("alone", "thread", "process"):
            stop = threading.Event() if mode == "thread" else mp.Event()
            counter = mp.Value("l", 0)
            if mode == "thread":
                th = threading.Thread(target=decode_loop, args=(stop, counter, [0])); th.start()
            elif mode == "process":
                th = mp.get_context("fork").Process(target=decode_loop, args=(stop, counter, [0])); th.start()
            if mode != "alone":
                while counter.value < 20: time.sleep(0.1)
            c0, t0 = counter.value, time.perf_counter()
            rate, on_cpu = timed()
            dec = (counter.value - c0) / (time.perf_counter() - t0)
            if mode != "alone":
                stop.set(); th.join()
            results.setdefault(mode, []).append((round(rate, 1), round(on_cpu, 3), round(dec, 1)))
            print(rnd, mode, "tok/s %.1f on_cpu %.3f decode steps/s %.1f" % (rate, on_cpu, dec), flush=True)
    print(results)

if __name__ == "__main__":
    main()
