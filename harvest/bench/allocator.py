"""`harvest bench allocator`: lend / reclaim / small-alloc latency and fragmentation of the unified allocator
over the real host (or CUDA) backend and SGLang's token allocator, replaying the allocation pattern the
finetune engine really produces (harvest/bench/weight_pattern.py, recorded from a run).

The figure that matters is next to the measurement: reclaim time per MiB against one decode step's budget
(HARLI gives lent memory back within one step), and how much of that budget reclaiming the pattern's peak
of lent memory takes.

Deferred imports: each bench imports its machinery (torch, SGLang, the replay) when it runs, not when `harvest bench`
lists it.
"""

import argparse
import math
import os
import statistics
import time

import torch

from allocator.config import AllocatorConfig
from allocator.unified_allocator import UnifiedAllocator
from harvest.bench.weight_pattern import (
    ALLOC,
    FREE,
    SHIPPED_PATH,
    UNIT_END,
    load_pattern,
)

# KV geometry of the model the shipped pattern was recorded on (SmolLM2-135M: 30 layers, 3 KV heads x 64, bf16).
KV_GEOMETRY = {"num_layers": 30, "num_kv_heads": 3, "head_dim": 64, "dtype_bytes": 2}
MIB = 1 << 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=["host", "cuda"], default="host")
    parser.add_argument("--num-chunks", type=int, default=6, help="KV pool size in chunks (SmolLM2: 16384 tokens each)")
    parser.add_argument("--repeats", type=int, default=20, help="lend/reclaim and small-alloc repetitions")
    parser.add_argument("--pattern", default=str(SHIPPED_PATH), help="recorded allocation pattern to replay")
    parser.add_argument("--tpot-ms", type=float, default=40.0, help="one decode step's budget (default 40, HARLI's)")
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="torch CPU threads while timing (the 2-core CI host stalls multi-threaded small ops)")


def run(args: argparse.Namespace) -> dict:
    from base.cuda_driver import ensure_driver_or_stub  # deferred: test_gpu_twin's H100 stand-in patches it

    ensure_driver_or_stub()
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    from harvest.sglang.chunk_token_allocator import ChunkTokenToKVPoolAllocator

    torch.set_num_threads(args.torch_threads)
    pattern = load_pattern(args.pattern)
    events = pattern["events"]
    sizes = {e[1]: e[2] for e in events if e[0] == ALLOC}
    geometry = KV_GEOMETRY
    probe = AllocatorConfig.for_kv_pool(*geometry.values(), 1)
    config = AllocatorConfig.for_kv_pool(
        *geometry.values(), args.num_chunks * probe.slots_per_chunk - 1, backend=args.backend)
    allocator = UnifiedAllocator(config)
    tokens = ChunkTokenToKVPoolAllocator(config.num_slots - 1, torch.int64, allocator.backend.device, None, True,
                                         config.slots_per_chunk)
    allocator.attach_kv_slots(tokens)
    try:
        lend_us, reclaim_us = _lend_reclaim_us(allocator, args.repeats)
        small_us = _small_alloc_us(allocator, args.repeats * 50)
        replay = _replay(allocator, events)
    finally:
        allocator.close()
    chunk_mib = config.blocks_per_chunk * config.block_bytes / MIB
    reclaim_ms_per_mib = reclaim_us / 1e3 / chunk_mib
    peak_chunks = math.ceil(replay["peak_lent_mib"] / chunk_mib)
    return {
        "lend_us_per_chunk": lend_us,
        "reclaim_us_per_chunk": reclaim_us,
        "lend_ms_per_mib": lend_us / 1e3 / chunk_mib,
        "reclaim_ms_per_mib": reclaim_ms_per_mib,
        "step_budget_ms": args.tpot_ms,
        "reclaim_mib_within_step_budget": args.tpot_ms / reclaim_ms_per_mib,
        "reclaim_peak_ms": peak_chunks * reclaim_us / 1e3,
        "reclaim_peak_fraction_of_step_budget": peak_chunks * reclaim_us / 1e3 / args.tpot_ms,
        "small_alloc_us": small_us,
        "fragmentation_pct": replay["max_pct"],
        "fragmentation": replay,
        "pattern": {"path": args.pattern, "source": pattern["source"], "num_allocs": len(sizes),
                    "num_units": sum(e[0] == UNIT_END for e in events)},
        "geometry": {"backend": args.backend, "torch_threads": args.torch_threads, "block_mib": config.block_bytes / MIB,
                     "chunk_mib": chunk_mib, "slots_per_chunk": config.slots_per_chunk,
                     "num_chunks": config.num_chunks},
    }


def print_result(result: dict, console) -> None:
    """The metric table, then the figure it is for, as gpt-fast prints bandwidth achieved."""
    from harvest.bench.metric_table import print_table

    print_table("harvest bench allocator", result, console)
    console.print(f"lend {result['lend_ms_per_mib']:.4f} ms/MiB, reclaim {result['reclaim_ms_per_mib']:.4f} ms/MiB: "
                  f"{result['reclaim_mib_within_step_budget']:.0f} MiB reclaimed within one "
                  f"{result['step_budget_ms']:g} ms step; the pattern's peak of lent memory comes back in "
                  f"{result['reclaim_peak_ms']:.3f} ms, {100 * result['reclaim_peak_fraction_of_step_budget']:.2f} % "
                  "of the step")


def _lend_reclaim_us(allocator: UnifiedAllocator, repeats: int) -> tuple[float, float]:
    lend, reclaim = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        assert allocator.lend_chunks(1) == 1
        middle = time.perf_counter()
        assert allocator.return_idle_chunks(1) == 1
        lend.append(middle - start)
        reclaim.append(time.perf_counter() - middle)
    return statistics.median(lend) * 1e6, statistics.median(reclaim) * 1e6


def _small_alloc_us(allocator: UnifiedAllocator, repeats: int) -> float:
    start = time.perf_counter()
    for i in range(repeats):
        allocator.free_tensor(allocator.alloc_tensor((64 + i % 2000,), torch.float32))
    return (time.perf_counter() - start) / repeats * 1e6


def _replay(allocator: UnifiedAllocator, events: list[list]) -> dict:
    """Replays the recorded allocs and frees in order; fragmentation is sampled after every unit."""
    live: dict[int, torch.Tensor] = {}
    samples = []
    for event in events:
        if event[0] == ALLOC:
            live[event[1]] = allocator.alloc_tensor((event[2],), torch.uint8)
        elif event[0] == FREE:
            allocator.free_tensor(live.pop(event[1]))
        else:
            samples.append(allocator.stats())
    for tensor in live.values():
        allocator.free_tensor(tensor)
    pcts = [s["fragmentation_pct"] for s in samples]
    return {"max_pct": max(pcts), "final_pct": pcts[-1], "max_bytes": max(s["fragmentation_bytes"] for s in samples),
            "peak_lent_mib": max(s["lent_bytes"] for s in samples) / MIB,
            "peak_used_mib": max(s["lent_used_bytes"] for s in samples) / MIB}
