"""`harvest demo`: the main job on the embedded default model, start to finish on any machine.

Starts `harvest serve` on the embedded SmolLM2, sends a few concurrent pre-filled decode requests,
prints what came back and harvest's step stats, and stops the worker cleanly.
"""

import argparse
import asyncio
import time
from pathlib import Path

DEMO_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about idle GPUs.",
    "Explain LoRA in one sentence.",
    "List three prime numbers.",
]


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("demo", help="run the end-to-end demo on the embedded model")
    parser.add_argument("--model-path", default=None, help="HF model dir (default: embedded SmolLM2-135M)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--admin-port", type=int, default=30100)
    parser.add_argument("--out", default="runs/demo", help="folder for the worker log")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from transformers import AutoTokenizer

    from harvest.models import resolve_model_path
    from harvest.stats_table import print_stats_table
    from harvest.worker_client import read_stats
    from harvest.worker_process import WorkerProcess

    console = Console()
    model_path = resolve_model_path(args.model_path)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                             tokenize=True, return_dict=False) for p in DEMO_PROMPTS]
    worker = WorkerProcess(["--model-path", str(model_path), "--max-total-tokens", "16384"], args.port,
                           args.admin_port, Path(args.out) / "worker.log")
    with console.status("starting harvest serve (SGLang decode worker) ..."):
        started = time.perf_counter()
        worker.start()
    console.print(f"worker ready in {time.perf_counter() - started:.0f} s at {worker.url}, admin {worker.admin_url}")
    try:
        results, elapsed_s = asyncio.run(_send_all(worker.url, prompts, args.max_new_tokens))
        num_tokens = sum(r["meta_info"]["completion_tokens"] for r in results)
        console.print(f"{len(results)} concurrent requests, {num_tokens} tokens in {elapsed_s:.2f} s "
                      "(fake transfer: prompts are not prefilled, so the text is the model decoding from empty KV)")
        for prompt, result in zip(DEMO_PROMPTS, results):
            console.print(f"  [bold]{prompt}[/bold] -> {result['text'][:60]!r}")
        print_stats_table(read_stats(worker.admin_url), console)
    finally:
        code = worker.stop()
    console.print(f"worker stopped (exit code {code})")
    return 0


async def _send_all(url: str, prompts: list[list[int]], max_new_tokens: int):
    import httpx

    from harvest.worker_client import generate_prefilled

    async with httpx.AsyncClient(timeout=300) as client:
        started = time.perf_counter()
        results = await asyncio.gather(*(generate_prefilled(client, url, ids, max_new_tokens, room)
                                         for room, ids in enumerate(prompts)))
    return results, time.perf_counter() - started
