"""GPU checks of the memory path: driver facts, the CUDA VMM backend, unmapping with work in flight, KV
lending and the weight window (torch + cuda-python; the reference is shared/gpu/smoke_gpu.py).

Deferred imports: torch, the CUDA bindings and the allocator are imported by the checks that use them, so a host without
a GPU stack still gets its report.
"""

import ctypes
import functools
import time

from harvest.doctor.check import FAIL, INFO, PASS, check_table
from harvest.doctor.kv_round_trip import kv_lend_reclaim
from harvest.doctor.vmm_round_trip import vmm_round_trip

GPU_MEMORY_CHECKS, memory_check = check_table(needs_gpu=True, isolated=True)

MIB = 1 << 20
BLOCK = 2 * MIB


def driver_value(result):
    """cuda.bindings returns (CUresult, *values): raise on an error, return the values."""
    from cuda.bindings import driver

    err, *values = result
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"driver call failed: {err}")
    return values[0] if len(values) == 1 else values


@memory_check(gate=True, isolated=False,
              expected="H100 SXM: sms 132 (PCIe 114), cc 9.0, driver >= 13000, torch_cuda 13.0, vmm 1, "
                       "granularity_min 2097152; gpudirect_rdma_with_vmm recorded (1 needed for PD KV over RDMA)",
              if_different="A wrong stack or no VMM: stop. gpudirect_rdma_with_vmm 0: mooncake cannot register "
                           "the VMM KV pool for RDMA")
def gpu_env() -> dict:
    import torch
    from cuda.bindings import driver

    props = torch.cuda.get_device_properties(0)
    driver_value(driver.cuInit(0))
    device = driver_value(driver.cuDeviceGet(0))
    attr = driver.CUdevice_attribute
    vmm = driver_value(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device))
    rdma = driver_value(driver.cuDeviceGetAttribute(
        attr.CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, device))
    prop = driver.CUmemAllocationProp()
    prop.type = driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = 0
    flags = driver.CUmemAllocationGranularity_flags
    granularity = driver_value(driver.cuMemGetAllocationGranularity(prop, flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM))
    recommended = driver_value(driver.cuMemGetAllocationGranularity(prop, flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
    ok = props.major >= 9 and vmm == 1 and granularity == BLOCK
    return {"status": PASS if ok else FAIL, "name": props.name, "sms": props.multi_processor_count,
            "cc": f"{props.major}.{props.minor}", "driver": driver_value(driver.cuDriverGetVersion()),
            "torch_cuda": torch.version.cuda, "vmm": vmm, "gpudirect_rdma_with_vmm": rdma,
            "granularity_min": granularity, "granularity_recommended": recommended}


@memory_check(gate=True, isolated=False,
              expected="hc_init 0, granularity 2097152, blocks_rdma_capable = gpudirect_rdma_with_vmm",
              if_different="100000: libcuda.so.1 not found (the CPU stub on LD_LIBRARY_PATH?); 100001: a missing "
                           "driver symbol")
def gpu_native() -> dict:
    import torch

    from allocator.native_vmm import cuda_library

    torch.cuda.init()
    lib = cuda_library()
    rc = lib.hc_init(0)
    granularity = ctypes.c_uint64()
    rc_granularity = lib.hc_granularity(0, ctypes.byref(granularity))
    rdma = ctypes.c_int(-1)
    rc_rdma = lib.hc_rdma_capable(0, ctypes.byref(rdma))
    ok = rc == 0 and rc_granularity == 0 and rc_rdma == 0 and granularity.value == BLOCK
    return {"status": PASS if ok else FAIL, "hc_init": rc, "hc_granularity": rc_granularity,
            "granularity": granularity.value, "blocks_rdma_capable": rdma.value}


@memory_check(gate=True,
              expected="created_bytes about 16 MiB; alias_reads, alias_writes, remap_ok, six_mib_blocks true",
              if_different="A mapping or access bug in hc_map_blocks (csrc/vmm/vmm_cuda.cpp)")
def gpu_vmm() -> dict:
    """CudaBackend create / reserve / map / alias / remap / unmap / release, 2 MiB and 6 MiB blocks."""
    import torch

    from allocator.cuda_backend import CudaBackend

    torch.cuda.init()
    free_before = torch.cuda.mem_get_info()[0]
    backend = CudaBackend(8, BLOCK)
    created = free_before - torch.cuda.mem_get_info()[0]
    checks = vmm_round_trip(backend, BLOCK, torch.cuda.synchronize)
    backend.close()
    six = CudaBackend(2, 6 * MIB)                   # lcm(2 MiB, 384-byte rows): SmolLM2's block
    addr6 = six.reserve(12 * MIB)
    six.map_blocks(addr6, [1, 0])
    six.byte_tensor(addr6, 12 * MIB).fill_(7)
    torch.cuda.synchronize()
    six_ok = bool((six.byte_tensor(addr6, 12 * MIB) == 7).all())
    six.unmap(addr6, 12 * MIB)
    six.release(addr6, 12 * MIB)
    six.close()
    ok = all(checks.values()) and six_ok and abs(created - 8 * BLOCK) <= 2 * BLOCK
    return {"status": PASS if ok else FAIL, "created_bytes": created, **checks, "six_mib_blocks": six_ok}


@memory_check(expected="outcome fault (illegal memory access): a lent KV range is unmapped",
              if_different="A read of a lent range returned bytes: a stray KV access would go unnoticed")
def gpu_stray_read() -> dict:
    """What a read of a lent (unmapped) KV range does on the device: harvest expects a fault."""
    import torch

    from allocator.cuda_backend import CudaBackend

    backend = CudaBackend(1, BLOCK)
    addr = backend.reserve(BLOCK)
    backend.map_blocks(addr, [0])
    view = backend.byte_tensor(addr, BLOCK)
    view.fill_(1)
    torch.cuda.synchronize()
    backend.unmap(addr, BLOCK)
    try:
        value = int(view.sum())
        return {"status": FAIL, "outcome": "read returned", "value": value}
    except RuntimeError as e:
        return {"status": PASS, "outcome": "fault", "error": str(e).splitlines()[0]}


def _unmap_inflight(mode: str, label: str) -> dict:
    """Unmap a lent tensor that a kernel (or an H2D copy) on another stream still uses. label "harvest":
    ChunkPool.free_tensor, which waits on the stream recorded with record_stream, then unmaps. label "raw": the
    backend's unmap with no wait, to record what the driver does (unmap_ms about the in-flight time: cuMemUnmap
    waited). One label a process: on the H100 the raw unmap under a copy aborted the process (2026-11-27)."""
    import torch

    from allocator.config import AllocatorConfig
    from allocator.unified_allocator import UnifiedAllocator

    config = AllocatorConfig(num_layers=16, kv_row_bytes=2048, num_chunks=4, backend="cuda")   # 32 blocks/chunk
    allocator = UnifiedAllocator(config)
    pool = allocator.chunk_pool
    pool.lend(3)
    num_bytes = config.blocks_per_chunk * BLOCK
    tensor = pool.alloc_tensor((num_bytes,), torch.uint8)
    tensor.fill_(1)
    host = torch.ones(num_bytes, dtype=torch.uint8).pin_memory() if mode == "dma" else None
    torch.cuda.synchronize()
    side = torch.cuda.Stream()                  # the copy stream / SGLang's forward stream
    with torch.cuda.stream(side):
        torch.cuda._sleep(int(2e8))             # ~100 ms of GPU clock, then touch the range
        total = tensor.copy_(host, non_blocking=True) if mode == "dma" else tensor.sum(dtype=torch.int64)
    started = time.perf_counter()
    if label == "harvest":
        pool.record_stream(tensor, side)
        pool.free_tensor(tensor)
    else:
        _, addr, mapped_bytes, _ = pool._tensors[tensor.data_ptr()]
        allocator.backend.unmap(addr, mapped_bytes)
    unmap_ms = round((time.perf_counter() - started) * 1e3, 2)
    try:
        side.synchronize()
        correct = mode == "dma" or int(total) == num_bytes
        values = {"unmap_ms": unmap_ms, "outcome": "no fault", "result_correct": correct}
    except RuntimeError as e:
        values = {"unmap_ms": unmap_ms, "outcome": "fault", "error": str(e).splitlines()[0]}
    if label == "raw":
        return {"status": INFO, **values}
    return {"status": PASS if values["outcome"] == "no fault" and values["result_correct"] else FAIL, **values}


raw_unmap_check = functools.partial(memory_check, record_only=True,
                                    if_different="nothing to fix: it says why free_tensor must wait")


@memory_check(expected="no fault, result_correct, unmap_ms about 100 (free_tensor waited for the kernel)",
              if_different="a fault: free_tensor does not wait for the streams recorded as using the range")
def gpu_unmap_inflight_kernel() -> dict:
    return _unmap_inflight("kernel", "harvest")


@memory_check(expected="as gpu_unmap_inflight_kernel, for an H2D copy on a side stream (a prefetch)",
              if_different="a fault: evicting a layer mid-prefetch can crash the worker")
def gpu_unmap_inflight_dma() -> dict:
    return _unmap_inflight("dma", "harvest")


@raw_unmap_check(expected="recorded: unmap_ms about 100 (cuMemUnmap waits itself) or about 0 and a fault (it does not)")
def gpu_unmap_raw_kernel() -> dict:
    return _unmap_inflight("kernel", "raw")


@raw_unmap_check(expected="recorded, as gpu_unmap_raw_kernel for an H2D copy; the process may die (the H100 of "
                          "2026-11-27 aborted)")
def gpu_unmap_raw_dma() -> dict:
    return _unmap_inflight("dma", "raw")


@memory_check(expected="filled, live_kv_intact, reclaimed_zeroed all true",
              if_different="A ChunkPool map/unmap bug on CUDA: live KV overwritten or finetune bytes leak into KV")
def gpu_kv_lend_reclaim() -> dict:
    from allocator.config import AllocatorConfig

    config = AllocatorConfig(num_layers=4, kv_row_bytes=8 * 128 * 2, num_chunks=6, backend="cuda")
    return kv_lend_reclaim(config, (8, 128), "cuda")


@memory_check(expected="window_forward_correct true, outcome no fault; evict_ms about the 256 MiB copy time",
              if_different="A fault: evict does not wait for the layer's copy event before unmapping")
def gpu_swap_evict() -> dict:
    """LayerSwapper over lent chunks: fetch -> wait -> forward is correct; a layer evicted right after its
    prefetch started (what shrink_window does to the layer needed last) waits for the copy, no fault."""
    import torch
    from torch import nn

    from allocator.config import AllocatorConfig
    from allocator.unified_allocator import UnifiedAllocator
    from harvest.finetune.layer_swapper import LayerSwapper

    config = AllocatorConfig(num_layers=2, kv_row_bytes=2048, num_chunks=160, backend="cuda")   # 4 blocks/chunk
    allocator = UnifiedAllocator(config)
    try:
        for chunk_id in range(1, config.num_chunks):
            allocator.chunk_pool.lend(chunk_id)
        layers = nn.ModuleList([nn.Sequential(nn.Linear(8192, 8192, bias=False)) for _ in range(2)])
        reference = [layer[0].weight.detach().clone() for layer in layers]
        for param in layers.parameters():
            param.requires_grad_(False)
        swapper = LayerSwapper(layers, torch.device("cuda"), memory=allocator)
        swapper.fetch(0)
        swapper.wait(0)
        x = torch.randn(16, 8192, device="cuda")
        correct = bool(torch.allclose(layers[0](x).cpu(), x.cpu() @ reference[0].T, atol=1e-2, rtol=1e-3))
        swapper.evict(0)
        swapper.fetch(1)                            # 256 MiB H2D on the copy stream ...
        started = time.perf_counter()
        swapper.evict(1)                            # ... evicted at once
        evict_ms = round((time.perf_counter() - started) * 1e3, 2)
        try:
            torch.cuda.synchronize()
            outcome = "no fault"
        except RuntimeError as e:
            outcome = f"fault: {str(e).splitlines()[0]}"
    finally:
        allocator.close()
    return {"status": PASS if correct and outcome == "no fault" else FAIL, "window_forward_correct": correct,
            "evict_ms": evict_ms, "outcome": outcome}
