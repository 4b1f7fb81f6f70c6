"""`harvest bench allocator`: lend / reclaim / small-alloc latency and fragmentation on SmolLM2's
layer-wise LoRA finetune pattern, over the real host (or CUDA) backend and SGLang's token allocator."""

import argparse
import os
import statistics
import time

import torch

from allocator.config import AllocatorConfig
from allocator.finetune_pattern import SMOLLM2_135M, FinetunePattern
from allocator.small_pool import small_pool_bytes_from_profile
from allocator.unified_allocator import UnifiedAllocator


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=["host", "cuda"], default="host")
    parser.add_argument("--num-chunks", type=int, default=6, help="KV pool size in chunks (SmolLM2: 16384 tokens each)")
    parser.add_argument("--repeats", type=int, default=20, help="lend/reclaim and small-alloc repetitions")
    parser.add_argument("--num-tokens", type=int, default=2048, help="tokens per finetune micro-batch")
    parser.add_argument("--window-layers", type=int, default=8, help="frozen-weight layers resident at once")
    parser.add_argument("--churn-rounds", type=int, default=60, help="window slide / activation re-alloc rounds")
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="torch CPU threads while timing (the 2-core CI host stalls multi-threaded small ops)")


def run(args: argparse.Namespace) -> dict:
    from base.cuda_driver import ensure_driver_or_stub
    ensure_driver_or_stub()
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    from harvest.sglang.chunk_token_allocator import ChunkTokenToKVPoolAllocator

    torch.set_num_threads(args.torch_threads)
    shape = SMOLLM2_135M
    pattern = FinetunePattern(shape, num_tokens=args.num_tokens, window_layers=args.window_layers)
    probe = AllocatorConfig.for_kv_pool(shape.num_layers, shape.num_kv_heads, shape.head_dim, 2, 1)
    small_pool_bytes = small_pool_bytes_from_profile([n for _, n in pattern.allocations()], probe.block_bytes)
    config = AllocatorConfig.for_kv_pool(
        shape.num_layers, shape.num_kv_heads, shape.head_dim, 2, args.num_chunks * probe.slots_per_chunk - 1,
        small_pool_bytes=small_pool_bytes, backend=args.backend)
    allocator = UnifiedAllocator(config)
    size = config.num_slots - 1
    tokens = ChunkTokenToKVPoolAllocator(size, torch.int64, allocator.backend.device, None, True, config.slots_per_chunk)
    allocator.attach_kv_slots(tokens)
    try:
        lend_us, reclaim_us = _lend_reclaim_us(allocator, args.repeats)
        small_us = _small_alloc_us(allocator, args.repeats * 50)
        fragmentation = _fragmentation(allocator, pattern, config.block_bytes, args.churn_rounds)
    finally:
        allocator.close()
    return {
        "lend_us_per_chunk": lend_us,
        "reclaim_us_per_chunk": reclaim_us,
        "small_alloc_us": small_us,
        "fragmentation_pct": fragmentation["max_pct"],
        "fragmentation": fragmentation,
        "geometry": {"backend": args.backend, "torch_threads": args.torch_threads, "block_mib": config.block_bytes / 2**20,
                     "chunk_mib": config.blocks_per_chunk * config.block_bytes / 2**20,
                     "slots_per_chunk": config.slots_per_chunk, "num_chunks": config.num_chunks,
                     "small_pool_mib": round(allocator.small_pool.num_bytes / 2**20, 2)},
    }


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


def _fragmentation(allocator: UnifiedAllocator, pattern: FinetunePattern, block_bytes: int, rounds: int) -> dict:
    """Allocates the pattern, then slides the window (free the oldest layer, load the next) and
    re-allocates the working activations each round; fragmentation is sampled after every round."""
    live = {kind: [] for kind in ("window", "lora", "checkpoint", "activation")}
    for kind, num_bytes in pattern.allocations():
        live[kind].append(allocator.alloc_tensor((num_bytes,), torch.uint8))
    layer_bytes = sum(pattern.layer_weight_sizes())
    samples = [allocator.stats()]
    for _ in range(rounds):
        allocator.free_tensor(live["window"].pop(0))
        for tensor in live["activation"]:
            allocator.free_tensor(tensor)
        live["window"].append(allocator.alloc_tensor((layer_bytes,), torch.uint8))
        live["activation"] = [allocator.alloc_tensor((n,), torch.uint8) for n in pattern.working_activation_sizes()]
        samples.append(allocator.stats())
    for tensors in live.values():
        for tensor in tensors:
            allocator.free_tensor(tensor)
    pcts = [s["fragmentation_pct"] for s in samples]
    return {"max_pct": max(pcts), "final_pct": pcts[-1], "max_bytes": max(s["fragmentation_bytes"] for s in samples),
            "lent_mib": samples[-1]["lent_bytes"] / 2**20,
            "used_mib": samples[-1]["lent_used_bytes"] / 2**20,
            "small_pool_used_mib": samples[-1]["small_pool_used_bytes"] / 2**20}
