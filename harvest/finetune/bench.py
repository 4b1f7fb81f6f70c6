"""`harvest bench finetune`: harvest's engine vs `llamafactory-cli train` on one config, side by side.

Both train the same YAML in this process (LlamaFactory through `run_exp`, what its CLI calls). Throughput is
steady state: non-padding tokens of steps 2..N over the summed wall time of those steps (the data order is
identical, so both process the same tokens). A step's time is a whole loop iteration for both: batch
loading and collation, forward/backward, optimizer, logging. Also measured: harvest with a window of one
layer (swapping every layer every pass), how fast shrinking the window returns memory, the largest
relative loss difference to LlamaFactory, with `--compiled-run` harvest with its layers compiled (what a CPU
worker runs: harvest.finetune.compiled_layers; its graphs made before the timed steps), and the bytes the job
holds with a copy of the base weights vs computing on the served ones (`base_weights`).

Deferred imports: the training libraries (llamafactory, transformers, peft, safetensors) are imported by the functions
that use them, so importing this module does not pay their seconds of start-up.
"""

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_STEPS = 8


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="LlamaFactory YAML (default: the demo YAML on the embedded SmolLM2)")
    parser.add_argument("--tiny", action="store_true", help="use the tiny random Llama job instead (seconds)")
    parser.add_argument("--model-path", help="override model_name_or_path")
    parser.add_argument("--max-steps", type=int, default=DEFAULT_STEPS, help=f"steps per run (default {DEFAULT_STEPS})")
    parser.add_argument("--device", default="cpu", help="device for harvest's units (LlamaFactory picks its own)")
    parser.add_argument("--no-window-run", action="store_true", help="skip the window-of-one-layer run")
    parser.add_argument("--compiled-run", action="store_true",
                        help="also harvest with its layers through torch.compile (a CPU worker's default)")
    parser.add_argument("--no-base-weights-run", action="store_true",
                        help="skip the base-weights memory rows (copy vs shared)")
    parser.add_argument("--num-threads", type=int, help="torch CPU threads for both (steadier on a shared host)")
    parser.add_argument(
        "--repeats", type=int, default=1, help="alternate the runs this many times; each step keeps its fastest time"
    )


def run(args: argparse.Namespace) -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("LLAMAFACTORY_VERBOSITY", "WARN")
    import torch

    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    with tempfile.TemporaryDirectory(prefix="harvest-bench-finetune-") as work_dir:
        return _bench(args, Path(work_dir))


def _bench(args: argparse.Namespace, work_dir: Path) -> dict:
    import torch

    from harvest.finetune.demo.tiny_job import write_tiny_job
    from harvest.finetune.llamafactory_args import LlamaFactoryArgs

    if args.tiny:
        config_path = write_tiny_job(work_dir, num_layers=4, max_steps=args.max_steps, save_steps=10**6)
    else:
        config_path = Path(args.config or Path(__file__).parent / "demo" / "demo.yaml")
    overrides = {"max_steps": args.max_steps, "save_steps": 10**6, "output_dir": str(work_dir / "harvest")}
    with contextlib.redirect_stdout(sys.stderr):
        llamafactory = LlamaFactoryArgs.from_yaml(config_path, overrides, model_path=args.model_path)

    lf_raw = {**llamafactory.raw, "output_dir": str(work_dir / "llamafactory"), "overwrite_output_dir": True}
    # LlamaFactory prints its training example on stdout, which must carry only the result JSON.
    lf_runs, harvest_runs, windowed_runs, compiled_runs = [], [], [], []
    with contextlib.redirect_stdout(sys.stderr):
        for _ in range(max(args.repeats, 1)):
            lf_runs.append(_run_llamafactory(lf_raw))
            harvest_runs.append(_run_harvest(llamafactory.raw, args.device, None))
            if args.compiled_run:
                compiled_runs.append(_run_harvest(llamafactory.raw, args.device, None, compile_layers=True))
            if not args.no_window_run:
                windowed_runs.append(_run_harvest(llamafactory.raw, args.device, 1))
    lf_losses = lf_runs[0][0]
    lf_step_s = _fastest_steps([step_s for _, step_s in lf_runs])
    harvest = {**harvest_runs[0], "step_s": _fastest_steps([run["step_s"] for run in harvest_runs])}
    windowed = None
    if windowed_runs:
        windowed = {**windowed_runs[0], "step_s": _fastest_steps([run["step_s"] for run in windowed_runs])}
    tokens = harvest["step_tokens"]
    lf_tps = sum(tokens[1:]) / sum(lf_step_s[1:])
    result = {
        "model": Path(llamafactory.raw["model_name_or_path"]).name,
        "device": args.device,
        "num_threads": torch.get_num_threads(),
        "repeats": len(lf_runs),
        "steps": len(tokens),
        "tokens_per_step": sum(tokens) / len(tokens),
        "llamafactory": {"tokens_per_s": lf_tps},
        "harvest": _versus(harvest, lf_step_s, tokens),
        "max_loss_rel_diff": max(abs(a - b) / abs(b) for a, b in zip(harvest["losses"], lf_losses)),
    }
    if not args.no_base_weights_run:
        with contextlib.redirect_stdout(sys.stderr):
            result["base_weights"] = _base_weights_memory(llamafactory.raw, args.device)
    if compiled_runs:
        compiled = {**compiled_runs[0], "step_s": _fastest_steps([run["step_s"] for run in compiled_runs])}
        result["harvest_compiled"] = {
            **_versus(compiled, lf_step_s, tokens),
            "max_loss_rel_diff": max(abs(a - b) / abs(b) for a, b in zip(compiled["losses"], lf_losses)),
        }
    if windowed is not None:
        result["harvest_window1"] = {
            **_versus(windowed, lf_step_s, tokens),
            "shrink_ms": windowed["shrink_ms"],
            "shrink_freed_bytes": windowed["shrink_freed_bytes"],
        }
    return result


def _fastest_steps(runs: list[list[float]]) -> list[float]:
    return [min(times) for times in zip(*runs)]


def _versus(run: dict, lf_step_s: list[float], tokens: list[int]) -> dict:
    """Steady-state tokens/s (step 1 pays one-time costs) and the median per-step speed ratio, which
    shrugs off bursts of load from other processes on a shared host."""
    tokens_per_s = sum(tokens[1:]) / sum(run["step_s"][1:])
    ratios = sorted(lf / ours for lf, ours in zip(lf_step_s[1:], run["step_s"][1:]))
    return {
        "tokens_per_s": tokens_per_s,
        "vs_llamafactory": tokens_per_s * sum(lf_step_s[1:]) / sum(tokens[1:]),
        "median_step_speed_vs_llamafactory": ratios[len(ratios) // 2],
    }


def _run_llamafactory(raw: dict) -> tuple[list[float], list[float]]:
    from llamafactory.train.tuner import run_exp
    from transformers import TrainerCallback

    step_s: list[float] = []

    # From one on_step_end to the next, so a step includes loading and collating its batches (the Trainer
    # fetches them before on_step_begin) and the previous step's logging: what harvest's run_step times.
    class StepClock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            self.last_end = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            now = time.perf_counter()
            step_s.append(now - self.last_end)
            self.last_end = now

    run_exp(raw, callbacks=[StepClock()])
    log = Path(raw["output_dir"]) / "trainer_log.jsonl"
    losses = [record["loss"] for record in map(json.loads, log.read_text().splitlines()) if "loss" in record]
    return losses, step_s


def _run_harvest(raw: dict, device: str, num_window_layers: int | None, compile_layers: bool = False) -> dict:
    from harvest.finetune import FinetuneConfig, FinetuneEngine
    from harvest.finetune.llamafactory_args import LlamaFactoryArgs

    output_dir = raw["output_dir"] + (f"-w{num_window_layers}" if num_window_layers else "")
    output_dir += "-compiled" if compile_layers else ""
    llamafactory = LlamaFactoryArgs.from_dict({**raw, "output_dir": output_dir})
    engine = FinetuneEngine(llamafactory, FinetuneConfig(device=device, num_window_layers=num_window_layers,
                                                         compile_layers=compile_layers))
    losses, step_s = [], []
    while not engine.is_finished:
        started = time.perf_counter()
        losses.append(engine.run_step().loss)
        step_s.append(time.perf_counter() - started)
    log = [json.loads(line) for line in (llamafactory.output_dir / engine.config.log_name).read_text().splitlines()]
    result = {"losses": losses, "step_tokens": [record["num_tokens"] for record in log], "step_s": step_s}
    # Shrink from all layers resident to one: the time until the evicted layers' storage is released.
    engine.set_window(engine.units.num_layers)
    resident_before = engine.stats()["resident_bytes"]
    started = time.perf_counter()
    engine.set_window(1)
    if engine.device.type == "cuda":
        import torch

        torch.cuda.empty_cache()
    result["shrink_ms"] = (time.perf_counter() - started) * 1e3
    result["shrink_freed_bytes"] = resident_before - engine.stats()["resident_bytes"]
    return result


def _base_weights_memory(raw: dict, device: str) -> dict:
    """Bytes the job holds after one step, with its own copy of the base weights (all layers resident) and on
    served ones. No worker runs here: the served tensors are the checkpoint's, loaded by name in the job's dtype
    on its device (what a worker started with `--dtype` of the job's holds; harvest.sglang.served_weights hands
    a real worker's over, tests/test_finetune_shared_weights.py)."""
    from harvest.finetune import FinetuneConfig, FinetuneEngine
    from harvest.finetune.base_weights import ServedWeights
    from harvest.finetune.llamafactory_args import LlamaFactoryArgs

    model_dir = raw["model_name_or_path"]
    rows, served, dtype = {}, None, None
    for mode in ("copy", "shared"):
        llamafactory = LlamaFactoryArgs.from_dict({**raw, "output_dir": raw["output_dir"] + f"-{mode}"})
        if mode == "shared":
            served = ServedWeights(_checkpoint_tensors(model_dir, dtype, device), None)
        engine = FinetuneEngine(llamafactory, FinetuneConfig(device=device, served_model_path=model_dir), served_weights=served)
        engine.run_step()
        dtype = next(p.dtype for p in engine.peft_model.parameters() if not p.requires_grad)
        rows[mode] = {"mode": engine.base_weights["mode"], "reason": engine.base_weights["reason"],
                      "frozen_bytes": engine.frozen_bytes(), "trainable_bytes": _trainable_bytes(engine),
                      "bytes_saved": engine.base_weights["bytes_saved"]}
        del engine
    return rows


def _checkpoint_tensors(model_dir: str, dtype, device: str) -> dict:
    from safetensors.torch import load_file

    tensors = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        tensors.update({name: t.to(device=device, dtype=dtype) for name, t in load_file(path).items()})
    return tensors


def _trainable_bytes(engine) -> int:
    """LoRA parameters, their gradients where held, and the optimizer's state."""
    import torch

    params = [p for p in engine.peft_model.parameters() if p.requires_grad]
    held = sum(p.numel() * p.element_size() for p in params)
    held += sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
    for state in engine.optimizer.state.values():
        held += sum(v.numel() * v.element_size() for v in state.values() if isinstance(v, torch.Tensor))
    return held
