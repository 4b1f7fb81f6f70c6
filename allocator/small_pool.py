"""SmallPool: allocations under one block, buddy-allocated at 2 KiB granularity in dedicated blocks."""

from collections.abc import Iterable, Sequence

import torch

from allocator.backend import Backend
from allocator.buddy_allocator import MIN_BYTES, BuddyAllocator
from allocator.chunk_pool import OutOfLentMemory, tensor_bytes
from base.errors import HarvestError


class SmallPool:
    def __init__(self, backend: Backend, block_ids: Sequence[int]):
        self.backend = backend
        self.num_bytes = len(block_ids) * backend.block_bytes
        self.max_bytes = max_small_bytes(backend.block_bytes)
        self.buddy = BuddyAllocator(self.num_bytes, backend.block_bytes & -backend.block_bytes)
        self.base = backend.reserve(self.num_bytes) if block_ids else 0
        if block_ids:
            backend.map_blocks(self.base, block_ids)
            self._bytes = backend.byte_tensor(self.base, self.num_bytes)
        self._requested: dict[int, int] = {}

    def alloc_tensor(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        num_bytes = tensor_bytes(shape, dtype)
        if not self.takes(num_bytes):
            raise HarvestError(f"small pool takes allocations under one block and up to {self.max_bytes} bytes, "
                               f"got {num_bytes}")
        offset = self.buddy.alloc(num_bytes)
        if offset is None:
            raise OutOfLentMemory(f"small pool of {self.num_bytes} bytes has no {num_bytes}-byte block free")
        self._requested[self.base + offset] = num_bytes
        return self._bytes[offset: offset + num_bytes].view(dtype).view(tuple(shape))

    def takes(self, num_bytes: int) -> bool:
        return num_bytes <= self.max_bytes

    def owns(self, tensor: torch.Tensor) -> bool:
        return tensor.data_ptr() in self._requested

    def free_tensor(self, tensor: torch.Tensor) -> None:
        addr = tensor.data_ptr()
        if addr not in self._requested:
            raise HarvestError(f"free_tensor: {addr:#x} is not a tensor allocated from the small pool")
        del self._requested[addr]
        self.buddy.free(addr - self.base)

    @property
    def used_bytes(self) -> int:
        return self.buddy.used_bytes

    @property
    def requested_bytes(self) -> int:
        return sum(self._requested.values())

    def close(self) -> None:
        if self.num_bytes:
            self.backend.unmap(self.base, self.num_bytes)
            self.backend.release(self.base, self.num_bytes)


def max_small_bytes(block_bytes: int) -> int:
    """Largest small-pool allocation: under one block and within one buddy root, the largest power of
    two dividing a block (2 MiB of a 6 MiB block)."""
    root = block_bytes & -block_bytes
    return root - 1 if root == block_bytes else root


def small_pool_bytes_from_profile(alloc_sizes: Iterable[int], block_bytes: int, headroom: float = 0.25) -> int:
    """Pool size from a profile of both tasks: allocation sizes in order, a negative size a free.

    Counts only what the small pool takes, each rounded up to its buddy block, at the peak of live
    bytes, plus headroom for buddy fragmentation.
    """
    live = peak = 0
    for num_bytes in alloc_sizes:
        if abs(num_bytes) > max_small_bytes(block_bytes):
            continue
        rounded = MIN_BYTES << max(0, (-(-abs(num_bytes) // MIN_BYTES) - 1).bit_length())
        live += rounded if num_bytes > 0 else -rounded
        peak = max(peak, live)
    return int(peak * (1 + headroom))
