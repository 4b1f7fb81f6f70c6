"""Every GPU doctor check body runs on this CPU host against a fake device: the fake `cuda.bindings.driver`
of test_green_partitions_driver.py (with the driver facts the doctor reads), torch's `cuda` tensors placed on
the CPU, recording streams and events, and the host VMM backend in place of the CUDA one. The values are the
fake's; what this pins is that every call a check makes exists and takes the arguments it is given (the
`free_tensor(tensor, after=[...])` TypeError killed both unmap-in-flight checks on the first GPU run)."""

import contextlib
import sys
from types import SimpleNamespace

import pytest
import torch
from test_green_partitions_driver import OK, FakeDriver
from torch.overrides import TorchFunctionMode

from harvest.doctor.check import FAIL, INFO, PASS
from harvest.doctor.gpu_memory_checks import GPU_MEMORY_CHECKS
from harvest.doctor.gpu_partition_checks import GPU_PARTITION_CHECKS
from harvest.doctor.gpu_stack_checks import GPU_STACK_CHECKS

GPU_CHECKS = GPU_STACK_CHECKS + GPU_MEMORY_CHECKS + GPU_PARTITION_CHECKS
NOT_ON_THE_FAKE = {
    "gpu_stray_read": "its finding is a device fault; on the host backend the same read kills the process "
                      "(host_stray_read runs it in a subprocess)",
    "gpu_confine": "its finding is which SMs a real kernel ran on (NVRTC-compiled %smid probe, CUDA graphs)",
    "gpu_swap_evict": "moves 2 x 256 MiB layers through a 1.25 GiB pool: too big for the CPU tier",
    "gpu_interference": "600 bf16 products of up to 8192 x 8192: hours on the CPU tier",
}
H100 = SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0, multi_processor_count=132,
                       total_memory=81559 * 2**20)


class DoctorDriver(FakeDriver):
    """The fake driver, plus the device facts gpu_env reads."""

    CUdevice_attribute = SimpleNamespace(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED="vmm",
                                         CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED="rdma")
    CUmemAllocationType = SimpleNamespace(CU_MEM_ALLOCATION_TYPE_PINNED="pinned")
    CUmemLocationType = SimpleNamespace(CU_MEM_LOCATION_TYPE_DEVICE="device")
    CUmemAllocationGranularity_flags = SimpleNamespace(CU_MEM_ALLOC_GRANULARITY_MINIMUM="min",
                                                       CU_MEM_ALLOC_GRANULARITY_RECOMMENDED="recommended")

    @staticmethod
    def CUmemAllocationProp():
        return SimpleNamespace(type=None, location=SimpleNamespace(type=None, id=None))

    def cuDeviceGetAttribute(self, attribute, device):
        return OK, {"vmm": 1, "rdma": 0}[attribute]

    def cuMemGetAllocationGranularity(self, prop, flag):
        assert prop.type == "pinned" and prop.location.type == "device"
        return OK, 2 << 20

    def cuDriverGetVersion(self):
        return OK, 13000


class FakeStream:
    def __init__(self, *args, **kwargs):
        self.cuda_stream = id(self)
        self.waited_on: list = []

    def synchronize(self):
        pass

    def wait_stream(self, other):
        self.waited_on.append(other)

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        return event or FakeEvent()

    def query(self):
        return True


class FakeEvent:
    def __init__(self, *args, **kwargs):
        pass

    def record(self, stream=None):
        pass

    def synchronize(self):
        pass

    def wait(self, stream=None):
        pass

    def elapsed_time(self, end):
        return 1.0


def _is_cuda(device) -> bool:
    return device is not None and torch.device(device).type == "cuda"


class CudaOnCpu(TorchFunctionMode):
    """Tensors a check asks for on `cuda` are made on the CPU; pinning is a no-op; record_stream takes fakes."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if func in (torch.Tensor.pin_memory, torch.Tensor.cuda):
            return args[0]
        if func is torch.Tensor.record_stream:
            return None
        if func is torch.Tensor.to and len(args) > 1 and isinstance(args[1], (str, torch.device)) and _is_cuda(args[1]):
            args = (args[0], "cpu", *args[2:])
        if func is torch.Tensor.is_cuda.__get__:
            return False
        return func(*args, **kwargs)


class FakeCudaLibrary:
    """libharvest_vmm_cuda.so's entry points gpu_native calls (ints by reference, rc 0)."""

    def hc_init(self, device):
        return 0

    def hc_granularity(self, device, out):
        out._obj.value = 2 << 20
        return 0

    def hc_rdma_capable(self, device, out):
        out._obj.value = 0
        return 0


@pytest.fixture
def fake_device(monkeypatch):
    import cuda.bindings

    import allocator.cuda_backend
    import allocator.native_vmm
    from allocator.host_backend import HostBackend

    driver = DoctorDriver(132, [8] * 16, 4)
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", driver)
    monkeypatch.setattr(cuda.bindings, "driver", driver, raising=False)
    current = FakeStream()
    facts = {"is_available": lambda: True, "init": lambda: None, "synchronize": lambda device=None: None,
             "_sleep": lambda cycles: None, "Stream": FakeStream, "Event": FakeEvent,
             "ExternalStream": lambda handle, device=None: FakeStream(),
             "current_stream": lambda device=None: current, "stream": lambda s: contextlib.nullcontext(),
             "get_device_properties": lambda device=None: H100,
             "get_device_capability": lambda device=None: (H100.major, H100.minor),
             "mem_get_info": lambda device=None: (H100.total_memory // 2, H100.total_memory)}
    for name, fact in facts.items():
        monkeypatch.setattr(torch.cuda, name, fact)
    monkeypatch.setattr(allocator.cuda_backend, "CudaBackend",
                        lambda num_blocks, block_bytes, device_index=0: HostBackend(num_blocks, block_bytes))
    monkeypatch.setattr(allocator.native_vmm, "cuda_library", FakeCudaLibrary)
    with CudaOnCpu():
        yield driver


def test_every_gpu_check_runs_on_the_fake_or_says_why_not():
    names = {check.name for check in GPU_CHECKS}
    assert set(NOT_ON_THE_FAKE) <= names
    assert {check.name for check in GPU_CHECKS if check.name not in NOT_ON_THE_FAKE} == set(ON_THE_FAKE)


ON_THE_FAKE = ["gpu_stack", "gpu_env", "gpu_native", "gpu_vmm", "gpu_unmap_inflight_kernel",
               "gpu_unmap_inflight_dma", "gpu_unmap_raw_kernel", "gpu_unmap_raw_dma", "gpu_kv_lend_reclaim",
               "gpu_split", "gpu_handoff"]


@pytest.mark.parametrize("name", ON_THE_FAKE)
def test_gpu_check_body_runs_against_the_fake_device(name, fake_device):
    check = next(c for c in GPU_CHECKS if c.name == name)
    values = check.run()                 # an exception here is a wrong call: the doctor would report only it
    assert values["status"] in (PASS, FAIL, INFO) and len(values) > 1, values


def test_unmap_inflight_waits_for_the_stream_that_used_the_tensor(fake_device, monkeypatch):
    """Pins defect 4 (a): the check called `free_tensor(tensor, after=[event])`, a keyword free_tensor does not
    take. Now it records the side stream on the tensor, and free_tensor waits for it before the unmap."""
    from harvest.doctor.gpu_memory_checks import gpu_unmap_inflight_kernel

    waited = []
    monkeypatch.setattr("allocator.chunk_pool._wait_for", lambda streams: waited.append(list(streams)))
    values = gpu_unmap_inflight_kernel()
    assert values["status"] == PASS and values["outcome"] == "no fault", values
    assert any(len(streams) == 1 and isinstance(streams[0], FakeStream) for streams in waited)


def test_gpu_split_creates_the_contexts_it_reports(fake_device):
    """Pins defect 4 (b): green contexts are made on first use, and gpu_split read their count before making
    any (0 on every device). On 16 groups of 8 it now makes every co-run partition's."""
    from harvest.doctor.gpu_partition_checks import gpu_split

    values = gpu_split()
    assert values["status"] == PASS and values["groups"] == 16
    assert values["green_contexts_created"] == len(fake_device.contexts) > 0


def test_gpu_stack_names_what_is_missing(monkeypatch):
    """Pins defect 7: nvcc, tvm-ffi, libnuma.so.1 and cuda-bindings >= 13.0, each forced missing or old."""
    from harvest.doctor import gpu_stack_checks as stack

    monkeypatch.setattr(stack, "_nvcc", lambda: {"nvcc": "/bin/nvcc", "nvcc_version": "13.0"})
    monkeypatch.setattr(stack, "_loads", lambda soname: True)
    monkeypatch.setattr(stack, "_version", lambda name: {"cuda-bindings": "13.4.4", "apache-tvm-ffi": "0.1.9"}[name])
    assert stack.gpu_stack()["status"] == PASS
    for broken in ({"_nvcc": lambda: {"nvcc": None}}, {"_loads": lambda soname: soname != "libnuma.so.1"},
                   {"_version": lambda name: {"cuda-bindings": "12.9.0", "apache-tvm-ffi": "0.1.9"}[name]},
                   {"_version": lambda name: {"cuda-bindings": "13.4.4", "apache-tvm-ffi": None}[name]}):
        with monkeypatch.context() as m:
            for attr, value in broken.items():
                m.setattr(stack, attr, value)
            assert stack.gpu_stack()["status"] == FAIL, broken


def test_libnuma_probe_loads_a_real_library():
    from harvest.doctor.gpu_stack_checks import _loads

    assert _loads("libc.so.6") and not _loads("libharvest-no-such-library.so.1")


def test_gpu_handoff_runs_the_forward_on_a_green_context_stream(fake_device):
    """Pins defect 4 (c): the hand-off check used two ordinary streams; spatial decode runs on a partition's
    green-context stream, so the check now forwards on one (a context is made for it)."""
    from harvest.doctor.gpu_partition_checks import gpu_handoff

    assert gpu_handoff()["status"] == PASS and len(fake_device.contexts) >= 1
