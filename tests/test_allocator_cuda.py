"""CUDA backend of the unified allocator: loads everywhere (driver resolved at run time), runs for real
under the gpu marker (the property machine is TestCudaPool in test_allocator_pool.py)."""

import pytest
import torch

from allocator.config import AllocatorConfig
from allocator.native_vmm import CUDA_LIBRARY, VmmError
from allocator.unified_allocator import UnifiedAllocator
from base.native import NATIVE_BUILD_DIR

needs_cuda_library = pytest.mark.skipif(not (NATIVE_BUILD_DIR / CUDA_LIBRARY).exists(),
                                        reason="libharvest_vmm_cuda.so not built (no nvcc at set-up)")


@needs_cuda_library
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-driver path")
def test_cuda_backend_reports_a_missing_driver_as_an_error_naming_the_call():
    from allocator.cuda_backend import CudaBackend
    with pytest.raises(VmmError, match="hc_init failed"):
        CudaBackend(num_blocks=4, block_bytes=2 << 20)


def cuda_config(**fields) -> AllocatorConfig:
    defaults = {"num_layers": 4, "kv_row_bytes": 8 * 128 * 2, "num_chunks": 6, "backend": "cuda"}
    return AllocatorConfig(**{**defaults, **fields})


@pytest.mark.gpu
def test_cuda_kv_bytes_survive_lend_alloc_and_reclaim_of_other_chunks():
    config = cuda_config()
    allocator = UnifiedAllocator(config)
    try:
        pool = allocator.chunk_pool
        k_buffer, v_buffer = pool.kv_buffers(config.num_slots, (8, 128), torch.bfloat16)
        live = torch.arange(1, config.slots_per_chunk * 2, device="cuda")
        for i, buffer in enumerate(k_buffer + v_buffer):
            buffer[live] = float(i + 1)
        pool.lend(5)
        pool.lend(4)
        tensor = pool.alloc_tensor((2 * config.blocks_per_chunk * config.block_bytes // 2,), torch.bfloat16)
        tensor.fill_(-7.0)
        torch.cuda.synchronize()
        assert bool((tensor == -7.0).all())
        pool.free_tensor(tensor)
        pool.reclaim(4)
        pool.reclaim(5)
        for i, buffer in enumerate(k_buffer + v_buffer):
            assert bool((buffer[live] == float(i + 1)).all())
        k_buffer[0][4 * config.slots_per_chunk] = 3.0  # reclaimed chunk is writable again
    finally:
        allocator.close()


@pytest.mark.gpu
def test_free_tensor_waits_for_a_kernel_on_another_stream_that_records_it():
    """Pins defect 4 of issue 11 on the device: a lent tensor freed while a side stream still reads it."""
    config = cuda_config(num_layers=16, num_chunks=4)
    allocator = UnifiedAllocator(config)
    try:
        allocator.chunk_pool.lend(3)
        tensor = allocator.alloc_tensor((config.blocks_per_chunk * config.block_bytes,), torch.uint8)
        tensor.fill_(1)
        torch.cuda.synchronize()
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            torch.cuda._sleep(int(2e8))
            total = tensor.sum(dtype=torch.int64)
        allocator.record_stream(tensor, side)
        allocator.free_tensor(tensor)
        side.synchronize()
        assert int(total) == config.blocks_per_chunk * config.block_bytes
    finally:
        allocator.close()


@pytest.mark.gpu
def test_blocks_are_rdma_capable_exactly_where_the_device_supports_it():
    from cuda.bindings import driver

    from allocator.cuda_backend import CudaBackend
    _, device = driver.cuDeviceGet(0)
    _, supported = driver.cuDeviceGetAttribute(
        driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, device)
    backend = CudaBackend(num_blocks=2, block_bytes=2 << 20)
    try:
        assert backend.is_rdma_capable == bool(supported)
    finally:
        backend.close()
