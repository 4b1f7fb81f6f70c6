"""ChunkedMHATokenToKVPool: SGLang's MHATokenToKVPool with its per-layer K/V buffers taken from a ChunkPool."""

import torch
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

from allocator.chunk_pool import ChunkPool
from base.errors import HarvestError
from harvest.sglang.version import require_pinned_sglang


class ChunkedMHATokenToKVPool(MHATokenToKVPool):
    """Same constructor as MHATokenToKVPool plus chunk_pool; buffers are views of the pool's chunks."""

    def __init__(self, *args, chunk_pool: ChunkPool, **kwargs):
        self.chunk_pool = chunk_pool
        super().__init__(*args, **kwargs)

    def _create_buffers(self):
        adopt_chunk_buffers(self, self.chunk_pool)


def adopt_chunk_buffers(kv_pool: MHATokenToKVPool, chunk_pool: ChunkPool) -> None:
    """Point kv_pool's k_buffer / v_buffer, and the pointer tables derived from them, at chunk_pool.

    Works on a pool SGLang already built (its own buffers are dropped) or from _create_buffers.
    """
    require_pinned_sglang()
    if kv_pool.head_dim != kv_pool.v_head_dim or kv_pool.layer_num != chunk_pool.config.num_layers:
        raise HarvestError(f"KV pool ({kv_pool.layer_num} layers, head_dim {kv_pool.head_dim}/{kv_pool.v_head_dim})"
                           f" does not match the chunk pool ({chunk_pool.config.num_layers} layers, equal K/V dims)")
    # buffers: layer_num x [size + page_size, head_num, head_dim]; rows past size + page_size stay unused.
    kv_pool.k_buffer, kv_pool.v_buffer = chunk_pool.kv_buffers(
        kv_pool.size + kv_pool.page_size, (kv_pool.head_num, kv_pool.head_dim), kv_pool.store_dtype)
    kv_pool.k_data_ptrs = torch.tensor([x.data_ptr() for x in kv_pool.k_buffer], dtype=torch.uint64,
                                       device=kv_pool.device)
    kv_pool.v_data_ptrs = torch.tensor([x.data_ptr() for x in kv_pool.v_buffer], dtype=torch.uint64,
                                       device=kv_pool.device)
    kv_pool.data_ptrs = torch.cat([kv_pool.k_data_ptrs, kv_pool.v_data_ptrs], dim=0)
    kv_pool.data_strides = torch.tensor([x[0].nbytes for x in kv_pool.k_buffer + kv_pool.v_buffer],
                                        device=kv_pool.device)
