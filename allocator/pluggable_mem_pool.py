"""PluggableMemPool: torch's own CUDA allocations (autograd included) served from lent blocks.

torch's CUDAPluggableAllocator calls csrc/vmm's harvest_malloc/harvest_free, which sub-allocate,
block-granular, inside ranges this class registers: each range is one chunk-pool tensor of lent
blocks. Routing is by stream, not thread: torch.cuda.use_mem_pool only routes the calling thread and
autograd runs backward in its own thread, but on the stream of the forward ops, so every allocation
the finetune job makes on its stream (forward and backward) lands here, and decode's (other stream)
does not.
"""

from contextlib import contextmanager

import torch

from allocator.native_vmm import CUDA_LIBRARY, check_host, cuda_library
from allocator.unified_allocator import UnifiedAllocator
from base.errors import HarvestError
from base.native import native_library


class PluggableMemPool:
    def __init__(self, allocator: UnifiedAllocator):
        if allocator.config.backend != "cuda":
            raise HarvestError("PluggableMemPool needs the cuda backend")
        self.allocator = allocator
        self.lib = cuda_library()
        check_host("harvest_arena_configure", self.lib.harvest_arena_configure(allocator.config.block_bytes))
        # Same path as cuda_library(): dlopen hands torch the already loaded copy, so the arena is shared.
        self.pluggable = torch.cuda.memory.CUDAPluggableAllocator(
            str(native_library(CUDA_LIBRARY)), "harvest_malloc", "harvest_free")
        self.pool = torch.cuda.MemPool(self.pluggable.allocator())
        self._ranges: list[torch.Tensor] = []

    def grow(self, num_blocks: int) -> None:
        """Add num_blocks lent blocks (lending chunks as needed) for torch's allocations."""
        backing = self.allocator.alloc_tensor((num_blocks * self.allocator.config.block_bytes,), torch.uint8)
        check_host("harvest_arena_add", self.lib.harvest_arena_add(backing.data_ptr(), backing.numel()))
        self._ranges.append(backing)

    def shrink(self) -> int:
        """Give back every range torch no longer uses (after emptying torch's cache); returns how many."""
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        kept, num_freed = [], 0
        for backing in self._ranges:
            if self.lib.harvest_arena_remove(backing.data_ptr(), backing.numel()) == 0:
                self.allocator.free_tensor(backing)
                num_freed += 1
            else:
                kept.append(backing)
        self._ranges = kept
        return num_freed

    @contextmanager
    def routing(self, stream: torch.cuda.Stream):
        """Inside, allocations made on `stream` by any thread come from this pool."""
        device_index = stream.device.index
        with torch.cuda.stream(stream):
            torch._C._cuda_beginAllocateCurrentStreamToPool(device_index, self.pool.id)
            try:
                yield
            finally:
                torch._C._cuda_endAllocateToPool(device_index, self.pool.id)
                torch._C._cuda_releasePool(device_index, self.pool.id)

    def stats(self) -> dict:
        import ctypes
        range_bytes, used_bytes, num_live = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_uint64()
        self.lib.harvest_arena_stats(ctypes.byref(range_bytes), ctypes.byref(used_bytes), ctypes.byref(num_live))
        return {"torch_range_bytes": range_bytes.value, "torch_used_bytes": used_bytes.value,
                "torch_num_segments": num_live.value}
