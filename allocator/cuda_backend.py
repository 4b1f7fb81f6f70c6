"""CUDA backend: one cuMemCreate allocation per block, mapped with cuMemMap/cuMemSetAccess."""

import ctypes
from collections.abc import Sequence

import torch

from allocator.native_vmm import check_cuda, cuda_library, u64_array
from base.errors import HarvestError


class _DeviceRange:
    """Exposes a mapped device range to torch.as_tensor without torch owning it."""

    def __init__(self, addr: int, num_bytes: int):
        self.__cuda_array_interface__ = {
            "shape": (num_bytes,), "typestr": "|u1", "data": (addr, False), "version": 3, "strides": None,
        }


class CudaBackend:
    def __init__(self, num_blocks: int, block_bytes: int, device_index: int = 0):
        self.lib = cuda_library()
        check_cuda("hc_init", self.lib.hc_init(device_index))
        granularity = ctypes.c_uint64()
        check_cuda("hc_granularity", self.lib.hc_granularity(device_index, ctypes.byref(granularity)))
        if num_blocks <= 0 or block_bytes <= 0 or block_bytes % granularity.value:
            raise HarvestError(
                f"CUDA backend needs num_blocks > 0 and block_bytes a multiple of the granularity "
                f"{granularity.value}, got num_blocks={num_blocks} block_bytes={block_bytes}")
        self.device = torch.device("cuda", device_index)
        self.device_index = device_index
        self.block_bytes = block_bytes
        self.num_blocks = num_blocks
        rdma = ctypes.c_int()
        check_cuda("hc_rdma_capable", self.lib.hc_rdma_capable(device_index, ctypes.byref(rdma)))
        # Blocks are created gpuDirectRDMACapable where the device supports GPUDirect RDMA with VMM.
        self.is_rdma_capable = bool(rdma.value)
        self._handles = (ctypes.c_uint64 * num_blocks)()
        check_cuda("hc_create_blocks",
                   self.lib.hc_create_blocks(block_bytes, device_index, self._handles, num_blocks))

    def reserve(self, num_bytes: int) -> int:
        addr = ctypes.c_uint64()
        # Alignment 0: the driver's granularity (a 6 MiB block is not a power of two).
        check_cuda("hc_reserve", self.lib.hc_reserve(num_bytes, 0, ctypes.byref(addr)))
        return addr.value

    def release(self, addr: int, num_bytes: int) -> None:
        check_cuda("hc_release", self.lib.hc_release(addr, num_bytes))

    def map_blocks(self, addr: int, block_ids: Sequence[int]) -> None:
        handles = u64_array(self._handles[block_id] for block_id in block_ids)
        check_cuda("hc_map_blocks",
                   self.lib.hc_map_blocks(addr, self.block_bytes, handles, len(block_ids), self.device_index))

    def map_blocks_at(self, addrs: Sequence[int], block_ids: Sequence[int]) -> None:
        handles = u64_array(self._handles[block_id] for block_id in block_ids)
        check_cuda("hc_map_blocks_at", self.lib.hc_map_blocks_at(u64_array(addrs), self.block_bytes, handles,
                                                                 len(handles), self.device_index))

    def unmap(self, addr: int, num_bytes: int) -> None:
        # Waits for the caller's stream only (a device-wide sync would wait on the finetune stream and
        # stall decode); ChunkPool waits for the other streams that used the range (record_stream).
        torch.cuda.current_stream(self.device).synchronize()
        check_cuda("hc_unmap", self.lib.hc_unmap(addr, num_bytes, self.block_bytes))

    def unmap_blocks(self, addrs: Sequence[int]) -> None:
        torch.cuda.current_stream(self.device).synchronize()
        check_cuda("hc_unmap_blocks", self.lib.hc_unmap_blocks(u64_array(addrs), len(addrs), self.block_bytes))

    def remap_block(self, addr: int, block_id: int) -> None:
        self.unmap(addr, self.block_bytes)
        self.map_blocks(addr, [block_id])

    def zero(self, addr: int, num_bytes: int) -> None:
        self.byte_tensor(addr, num_bytes).zero_()

    def byte_tensor(self, addr: int, num_bytes: int) -> torch.Tensor:
        return torch.as_tensor(_DeviceRange(addr, num_bytes), device=self.device)

    def close(self) -> None:
        if self._handles is not None:
            check_cuda("hc_destroy_blocks", self.lib.hc_destroy_blocks(self._handles, self.num_blocks))
            self._handles = None
