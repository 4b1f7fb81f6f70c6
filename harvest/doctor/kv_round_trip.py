"""The KV lend / reclaim round trip the host and GPU checks both run, on their own allocator backend.

Deferred imports: torch, the CUDA bindings and the allocator are imported by the checks that use them, so a host without
a GPU stack still gets its report.
"""

from harvest.doctor.check import FAIL, PASS


def kv_lend_reclaim(config, row_shape: tuple[int, int], device: str) -> dict:
    """The lend / use / reclaim round trip on an allocator of `config` (host or CUDA backend): chunks 4 and 5 lent
    and used as one tensor, then reclaimed, beside live KV in chunks 0 and 1."""
    import torch

    from allocator.unified_allocator import UnifiedAllocator

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    allocator = UnifiedAllocator(config)
    try:
        pool = allocator.chunk_pool
        k, v = pool.kv_buffers(config.num_slots, row_shape, torch.bfloat16)   # per layer [num_slots, *row_shape]
        live = torch.arange(1, 2 * config.slots_per_chunk, device=device)
        for i, buffer in enumerate(k + v):
            buffer[live] = float(i + 1)
        pool.lend(5)
        pool.lend(4)
        tensor = pool.alloc_tensor((config.blocks_per_chunk * config.block_bytes // 2,), torch.bfloat16)
        tensor.fill_(-7.0)
        sync()
        filled = bool((tensor == -7.0).all())
        pool.free_tensor(tensor)
        pool.reclaim(4)
        pool.reclaim(5)
        sync()
        intact = all(bool((b[live] == float(i + 1)).all()) for i, b in enumerate(k + v))
        zeroed = all(bool((b[4 * config.slots_per_chunk:] == 0).all()) for b in k + v)
    finally:
        allocator.close()
    ok = filled and intact and zeroed
    return {"status": PASS if ok else FAIL, "filled": filled, "live_kv_intact": intact, "reclaimed_zeroed": zeroed}
