"""`harvest finetune CFG.yaml`: run a LlamaFactory SFT-LoRA config on harvest's layer-wise engine, alone.

Deferred imports: the machinery is imported in `run()`, since `harvest --help` imports every subcommand module.
"""

import argparse
import contextlib
import os
import signal
import sys

import yaml

from base.errors import HarvestError

# FinetuneConfig fields as `harvest finetune` spells them, for error messages.
FINETUNE_FLAGS = {"num_window_layers": "--window", "max_unit_ms": "--max-unit-ms", "device": "--device",
                  "resume": "--resume"}


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("finetune", help="train a LoRA adapter from a LlamaFactory YAML, alone")
    parser.add_argument("config", help="LlamaFactory training YAML (stage sft, finetuning_type lora)")
    parser.add_argument("--model-path", help="override model_name_or_path ('harvest:embedded' = SmolLM2-135M)")
    parser.add_argument("--output-dir", help="override output_dir")
    parser.add_argument("--max-steps", type=int, help="override max_steps")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override any YAML key (repeatable)"
    )
    parser.add_argument("--device", default="cpu", help="torch device for the units (default: cpu)")
    parser.add_argument("--window", type=int, help="resident decoder layers (default: all, no swapping)")
    parser.add_argument("--max-unit-ms", type=float, help="split micro-batches so one unit stays under this")
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint in output_dir")
    parser.add_argument("--num-threads", type=int, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def parse_overrides(args: argparse.Namespace) -> dict:
    overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise HarvestError(f"--set {item!r}: expected KEY=VALUE")
        overrides[key.strip()] = yaml.safe_load(value)
    if args.output_dir is not None:
        overrides["output_dir"] = args.output_dir
    if args.max_steps is not None:
        overrides["max_steps"] = args.max_steps
    return overrides


def run(args: argparse.Namespace) -> int:
    # Parsed once at the edge: harvest runs offline and keeps LlamaFactory's INFO logging off the terminal.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("LLAMAFACTORY_VERBOSITY", "WARN")
    import torch

    from harvest.finetune import FinetuneEngine
    from harvest.finetune.job_validation import check_job, finetune_config

    if args.num_threads is not None:
        if args.num_threads < 1:
            raise HarvestError(f"--num-threads must be >= 1, got {args.num_threads}")
        torch.set_num_threads(args.num_threads)

    config = finetune_config(FINETUNE_FLAGS, device=args.device, num_window_layers=args.window,
                             max_unit_ms=args.max_unit_ms, resume=args.resume)
    job = check_job(args.config, config, parse_overrides(args), model_path=args.model_path)
    # LlamaFactory prints its first training example on stdout; keep stdout for results.
    with contextlib.redirect_stdout(sys.stderr):
        try:
            engine = FinetuneEngine(job, config)
        except ValueError as e:  # what only the loaded model reveals, e.g. a lora_target naming no module
            raise HarvestError(f"the job could not be built: {e}") from None
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    was_finished = engine.is_finished
    try:
        _train(engine, show_progress=not args.quiet)
    except KeyboardInterrupt:
        checkpoint = engine.close()
        print(f"interrupted at step {engine.global_step}; checkpoint {checkpoint}", file=sys.stderr)
        return 130
    # On --resume of a finished job this rewrites the same checkpoint and adapter: a kill between the two
    # writes of the first close() can leave an adapter of an earlier run in output_dir.
    engine.close()
    output_dir = engine.llamafactory.output_dir
    log_path = output_dir / engine.config.log_name
    if was_finished:
        print(f"already finished at step {engine.global_step}; adapter in {output_dir}, log {log_path}",
              file=sys.stderr)
        return 0
    stats = engine.stats()
    print(
        f"finished {stats['step']} steps: loss {stats['loss']:.4f}, {stats['mean_tokens_per_s']:.0f} tokens/s; "
        f"adapter in {output_dir}, log {log_path}",
        file=sys.stderr,
    )
    return 0


def _train(engine, show_progress: bool) -> None:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    columns = [
        TextColumn("step"),
        MofNCompleteColumn(),
        BarColumn(),
        TextColumn("loss {task.fields[loss]}  {task.fields[tps]} tok/s  window {task.fields[window]}"),
        TimeElapsedColumn(),
    ]
    with Progress(*columns, disable=not show_progress, transient=False) as progress:
        stats = engine.stats()
        task = progress.add_task(
            "finetune", total=stats["max_steps"], completed=stats["step"], loss="-", tps="-", window=stats["window"]
        )
        while not engine.is_finished:
            engine.run_step()
            stats = engine.stats()
            progress.update(
                task,
                completed=stats["step"],
                loss=f"{stats['loss']:.4f}",
                tps=f"{stats['tokens_per_s']:.0f}",
                window=f"{stats['window']}/{stats['num_layers']}",
            )


def _raise_keyboard_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt
