"""GPU checks of the SM partitions: the green split the driver gives, confinement of eager kernels and CUDA
graphs (an `%smid` probe), the stream hand-off race, decode latency beside a saturating finetune partition.

Deferred imports: torch, the CUDA bindings and the allocator are imported by the checks that use them, so a host without
a GPU stack still gets its report.
"""

import ctypes
import time
from types import SimpleNamespace

from harvest.doctor.check import FAIL, INFO, PASS, check_table
from harvest.doctor.gpu_memory_checks import driver_value

GPU_PARTITION_CHECKS, partition_check = check_table(needs_gpu=True, isolated=True)


def _h100_pairs(num_sms: int, g: int = 8) -> list[tuple[int, int]]:
    """The planner's partition grid (predictor.partition_grid) for an H100, solo and co-run pairs."""
    infer = sorted(set(range(g, num_sms + 1, g)) | {num_sms})
    return [(i, 0) for i in infer] + [(i, f) for i in infer if i % g == 0 for f in range(g, num_sms - i + 1, g)]


@partition_check(expected="H100 SXM: groups 16 of [8] + remainder 4, or 15 + 12; partitions_kept > 0, those that "
                          "need more groups than the driver gives dropped with a warning",
                 if_different="partitions_kept 0: spatial mode cannot run on this device; sizes other than [8] are "
                              "handled (partitions are built from the sizes the driver returns)")
def gpu_split() -> dict:
    import torch
    from cuda.bindings import driver

    from harvest.colocation.green_partitions import GreenPartitions

    torch.cuda.init()
    driver_value(driver.cuInit(0))
    device = driver_value(driver.cuDeviceGet(0))
    resource = driver_value(driver.cuDeviceGetDevResource(device, driver.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM))
    groups, num_groups, remainder = driver_value(driver.cuDevSmResourceSplitByCount(
        resource.sm.smCount // 8, resource, 0, 8))
    sizes = sorted({g.sm.smCount for g in list(groups)[:num_groups]})
    parts = GreenPartitions(0, _h100_pairs(resource.sm.smCount))
    parts.prepare([pair for pair in parts.pairs if pair[1]])   # contexts are made on first use: make them now
    return {"status": PASS if parts.pairs else FAIL, "sm_count": resource.sm.smCount, "groups": num_groups,
            "group_sizes": sizes, "remainder_sms": remainder.sm.smCount, "partitions_kept": len(parts.pairs),
            "partitions_dropped": len(parts.dropped_pairs), "green_contexts_created": parts.num_contexts}


PROBE = r'''
extern "C" __global__ void smid_probe(int* out, long long spin) {
  unsigned int s; asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  long long t0 = clock64(); while (clock64() - t0 < spin) { }
  if (threadIdx.x == 0) out[blockIdx.x] = (int)s;
}
'''


def _probe_kernel():
    """The `%smid` probe compiled with NVRTC for the device's architecture, loaded context-independently."""
    import torch
    from cuda.bindings import driver, nvrtc

    major, minor = torch.cuda.get_device_capability(0)
    _, program = nvrtc.nvrtcCreateProgram(PROBE.encode(), b"probe.cu", 0, [], [])
    options = [f"--gpu-architecture=sm_{major}{minor}".encode()]
    (err,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, size = nvrtc.nvrtcGetProgramLogSize(program)
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(program, log)
        raise RuntimeError(log.decode())
    _, size = nvrtc.nvrtcGetCUBINSize(program)
    cubin = b" " * size
    nvrtc.nvrtcGetCUBIN(program, cubin)
    image = ctypes.create_string_buffer(cubin, len(cubin))
    _probe_kernel.image = image                     # the library references the image for its lifetime
    library = driver_value(driver.cuLibraryLoadData(ctypes.addressof(image), None, None, 0, None, None, 0))
    return driver.CUfunction(int(driver_value(driver.cuLibraryGetKernel(library, b"smid_probe"))))


def _launch(kernel, stream_ptr: int, out, spin: int) -> None:
    from cuda.bindings import driver

    args = ((out.data_ptr(), spin), (ctypes.c_void_p, ctypes.c_longlong))
    driver_value(driver.cuLaunchKernel(kernel, out.numel(), 1, 1, 64, 1, 1, 0, driver.CUstream(stream_ptr), args, 0))


def _decode_finetune_pair():
    import torch

    from harvest.colocation.green_partitions import GreenPartitions

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    half = (sms // 8 // 2) * 8                      # 64 + 56 on an H100 SXM
    parts = GreenPartitions(0, [(half, half - 8)])
    return half, parts.streams(half, half - 8)


@partition_check(expected="decode_partition_sms <= 64, finetune_partition_sms <= 56, concurrent_overlap 0, "
                          "captured_green <= 64; captured_primary recorded",
                 if_different="captured_primary 132 (or an error) with captured_green <= 64: graphs captured outside "
                              "the partition are not confined; decode graphs must be captured per partition stream")
def gpu_confine() -> dict:
    import torch

    half, (decode, finetune) = _decode_finetune_pair()
    kernel = _probe_kernel()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    blocks, spin = 8 * sms, 200_000

    def sms_used(stream_ptr: int) -> set:
        out = torch.full((blocks,), -1, dtype=torch.int32, device="cuda")
        torch.cuda.synchronize()
        _launch(kernel, stream_ptr, out, spin)
        torch.cuda.synchronize()
        return set(out.tolist())

    eager_decode, eager_finetune = sms_used(decode.cuda_stream), sms_used(finetune.cuda_stream)
    eager_all = sms_used(torch.cuda.current_stream().cuda_stream)
    out_a = torch.full((blocks,), -1, dtype=torch.int32, device="cuda")
    out_b = torch.full((blocks,), -1, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    _launch(kernel, decode.cuda_stream, out_a, 2_000_000)
    _launch(kernel, finetune.cuda_stream, out_b, 2_000_000)
    torch.cuda.synchronize()
    overlap = set(out_a.tolist()) & set(out_b.tolist())
    # A graph captured on a primary-context side stream (SGLang's CudaGraphRunner) and one captured on the
    # decode partition's stream, both replayed on the decode stream.
    graphs, capture = {}, {}
    for label, capture_stream in (("captured_primary", torch.cuda.Stream()), ("captured_green", decode)):
        out = torch.full((blocks,), -1, dtype=torch.int32, device="cuda")
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        try:
            free_before, started = torch.cuda.mem_get_info()[0], time.perf_counter()
            with torch.cuda.graph(graph, stream=capture_stream):
                _launch(kernel, capture_stream.cuda_stream, out, spin)
            torch.cuda.synchronize()
            # One probe kernel: the fixed cost of a capture on this stream; a worker's decode sets are in its
            # stats (colocation.decode_graph_sets: capture_s, capture_mib per group).
            capture[label] = {"ms": round((time.perf_counter() - started) * 1e3, 2),
                              "kib": (free_before - torch.cuda.mem_get_info()[0]) >> 10}
            out.fill_(-1)
            torch.cuda.synchronize()
            with torch.cuda.stream(decode):
                graph.replay()
            decode.synchronize()
            graphs[label] = len(set(out.tolist()))
        except Exception as e:  # noqa: BLE001 - the driver's answer is the measurement
            graphs[label] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    ok = (len(eager_decode) <= half and len(eager_finetune) <= half - 8 and not overlap
          and isinstance(graphs.get("captured_green"), int) and graphs["captured_green"] <= half)
    return {"status": PASS if ok else FAIL, "device_sms": len(eager_all), "decode_partition_sms": len(eager_decode),
            "finetune_partition_sms": len(eager_finetune), "concurrent_overlap": len(overlap),
            "graph_replayed_on_decode_stream_sms": graphs, "graph_capture": capture}


@partition_check(expected="with_wait_stream all false (without_wait true shows the race the hook must avoid)",
                 if_different="with_wait_stream true: wait_stream does not order the streams; wrong tokens")
def gpu_handoff() -> dict:
    """Inputs written late on a schedule stream, forward on a partition's decode stream (a green context's, as
    in spatial mode), `.tolist()` back on the schedule stream: wrong values with a bare stream switch, right
    ones through the product's hand-off (harvest/sglang/step_streams.py, what the run_batch hook runs)."""

    import torch

    from harvest.sglang.step_streams import StepStreams

    n = 1 << 20
    _, (other, _) = _decode_finetune_pair()
    schedule = torch.cuda.Stream()
    handoff = StepStreams(SimpleNamespace(enable_overlap=False))
    src = torch.arange(n, device="cuda")
    expected = (src * 2).tolist()
    wrong = {}

    def run_on_other(handed_off: bool, forward, batch):
        if handed_off:
            return handoff.run(forward, other, batch)
        with torch.cuda.stream(other):
            return forward()

    for label, handed_off in (("without_wait", False), ("with_wait_stream", True)):
        with torch.cuda.stream(schedule):
            x = torch.full((n,), -1, dtype=torch.int64, device="cuda")
            torch.cuda._sleep(int(1e8))
            x.copy_(src)
            batch = SimpleNamespace(input_ids=x, sampling_info=None)
            y = run_on_other(handed_off, lambda b=batch: b.input_ids * 2, batch)
            input_race = y.tolist() != expected
        torch.cuda.synchronize()
        with torch.cuda.stream(schedule):
            batch = SimpleNamespace(input_ids=src.clone(), sampling_info=None)

            def late_forward(b=batch):
                y = torch.full((n,), -1, dtype=torch.int64, device="cuda")
                torch.cuda._sleep(int(1e8))
                torch.mul(b.input_ids, 2, out=y)
                return SimpleNamespace(next_token_ids=y)

            y = run_on_other(handed_off, late_forward, batch).next_token_ids
            output_race = y.tolist() != expected
        torch.cuda.synchronize()
        wrong[label] = {"input_race": input_race, "output_race": output_race}
    return {"status": PASS if not any(wrong["with_wait_stream"].values()) else FAIL, "wrong_values": wrong}


@partition_check(expected="ratio_p50 <= 1.2",
                 if_different="Much more than 1.2: shared work queues or memory-bandwidth "
                              "interference; try CU_WORKQUEUE_SCOPE_GREEN_CTX_BALANCED")
def gpu_interference() -> dict:
    import torch

    _, (decode, finetune) = _decode_finetune_pair()
    a = torch.randn(256, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    big = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()

    def decode_ms(reps: int = 50) -> tuple[float, float]:
        timings = []
        with torch.cuda.stream(decode):
            for _ in range(reps):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(8):
                    a @ w
                end.record()
                timings.append((start, end))
        decode.synchronize()
        ms = sorted(s.elapsed_time(e) for s, e in timings)
        return round(ms[len(ms) // 2], 3), round(ms[int(len(ms) * 0.99) - 1], 3)

    solo = decode_ms()
    with torch.cuda.stream(finetune):
        for _ in range(200):
            big @ big
    busy = decode_ms()
    torch.cuda.synchronize()
    return {"status": INFO, "decode_p50_p99_ms_solo": solo, "decode_p50_p99_ms_beside_finetune": busy,
            "ratio_p50": round(busy[0] / solo[0], 2)}
