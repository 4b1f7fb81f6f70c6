"""Host memory backend: one memfd holds every physical block; mapping is mmap(MAP_SHARED|MAP_FIXED)."""

import ctypes
from collections.abc import Sequence

import torch

from allocator.native_vmm import check_host, host_library, u64_array
from base.errors import HarvestError


class HostBackend:
    device = torch.device("cpu")

    def __init__(self, num_blocks: int, block_bytes: int):
        self.lib = host_library()
        page_bytes = ctypes.c_uint64()
        check_host("hv_page_bytes", self.lib.hv_page_bytes(ctypes.byref(page_bytes)))
        if num_blocks <= 0 or block_bytes <= 0 or block_bytes % page_bytes.value:
            raise HarvestError(
                f"host backend needs num_blocks > 0 and block_bytes a multiple of the page size "
                f"{page_bytes.value}, got num_blocks={num_blocks} block_bytes={block_bytes}")
        self.block_bytes = block_bytes
        self.num_blocks = num_blocks
        handle = ctypes.c_int64()
        check_host("hv_create", self.lib.hv_create(num_blocks * block_bytes, ctypes.byref(handle)))
        self._memfd = handle.value

    def reserve(self, num_bytes: int) -> int:
        addr = ctypes.c_uint64()
        check_host("hv_reserve", self.lib.hv_reserve(num_bytes, ctypes.byref(addr)))
        return addr.value

    def release(self, addr: int, num_bytes: int) -> None:
        check_host("hv_release", self.lib.hv_release(addr, num_bytes))

    def map_blocks(self, addr: int, block_ids: Sequence[int]) -> None:
        offsets = u64_array(block_id * self.block_bytes for block_id in block_ids)
        check_host("hv_map_blocks",
                   self.lib.hv_map_blocks(addr, self.block_bytes, self._memfd, offsets, len(block_ids)))

    def map_blocks_at(self, addrs: Sequence[int], block_ids: Sequence[int]) -> None:
        offsets = u64_array(block_id * self.block_bytes for block_id in block_ids)
        check_host("hv_map_blocks_at",
                   self.lib.hv_map_blocks_at(u64_array(addrs), self.block_bytes, self._memfd, offsets, len(offsets)))

    def unmap_blocks(self, addrs: Sequence[int]) -> None:
        check_host("hv_unmap_blocks", self.lib.hv_unmap_blocks(u64_array(addrs), len(addrs), self.block_bytes))

    def remap_block(self, addr: int, block_id: int) -> None:
        # MAP_FIXED replaces the old mapping atomically: no window where addr is unmapped.
        self.map_blocks(addr, [block_id])

    def unmap(self, addr: int, num_bytes: int) -> None:
        check_host("hv_unmap", self.lib.hv_unmap(addr, num_bytes))

    def zero(self, addr: int, num_bytes: int) -> None:
        check_host("hv_zero", self.lib.hv_zero(addr, num_bytes))

    def byte_tensor(self, addr: int, num_bytes: int) -> torch.Tensor:
        # frombuffer keeps the ctypes array alive as the tensor's base; the mapping outlives both.
        return torch.frombuffer((ctypes.c_uint8 * num_bytes).from_address(addr), dtype=torch.uint8)

    def close(self) -> None:
        if self._memfd >= 0:
            check_host("hv_destroy", self.lib.hv_destroy(self._memfd))
            self._memfd = -1
