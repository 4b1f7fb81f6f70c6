"""Green-context partitions: disjoint SM groups, concurrent, compute rate scaling with SMs (GPU only)."""

import time

import pytest

pytestmark = pytest.mark.gpu


def _matmul_rate(stream, n=4096, reps=20) -> float:
    import torch

    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    with torch.cuda.stream(stream):
        for _ in range(3):
            a @ a
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(reps):
            a @ a
        stream.synchronize()
    return reps / (time.perf_counter() - started)


def test_rate_scales_with_sms_and_pairs_run_concurrently():
    import torch

    from harvest.colocation.green_partitions import GreenPartitions

    props = torch.cuda.get_device_properties(0)
    g = 8 if props.major >= 9 else 4
    half = (props.multi_processor_count // g // 2) * g
    # (half, half) needs 2 * half SMs in groups; a device split into 15 groups of 8 forms (half, half - g).
    parts = GreenPartitions(0, [(g, half - g), (half, half), (half, half - g)])
    assert (g, half - g) in parts.pairs
    other_sms = half if (half, half) in parts.pairs else half - g
    small, _ = parts.streams(g, half - g)
    large, other = parts.streams(half, other_sms)
    rate_small, rate_large = _matmul_rate(small), _matmul_rate(large)
    assert rate_large > 2 * rate_small  # half the device vs one group: compute-bound rate follows the SMs

    # Two disjoint halves at once take about as long as one half alone, not twice as long.
    import torch

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    started = time.perf_counter()
    for stream in (large, other):
        with torch.cuda.stream(stream):
            for _ in range(20):
                a @ a
    torch.cuda.synchronize()
    both_s = time.perf_counter() - started
    assert both_s < 1.5 * (20 / rate_large)


def test_the_profiled_gpu_names_itself_and_times_the_job_alone_on_its_finetune_partitions(tmp_path):
    """`harvest profile --co-run`'s device on a real GPU: the driver's SM count and name, and the finetune job
    timed alone on the smallest and the largest finetune side, each unit on that partition's green stream."""
    import contextlib

    import torch

    from harvest.finetune.demo.tiny_job import write_tiny_job
    from harvest.profiler.finetune_profiler import FinetuneProfiler
    from harvest.profiler.profiled_device import local_device

    device = local_device()
    assert device.is_gpu and device.name == torch.cuda.get_device_name(0)
    assert device.grid(co_run=True).num_sms == torch.cuda.get_device_properties(0).multi_processor_count
    device.check_co_run()
    ft_sides = sorted({f for _, f in device.partitions.pairs if f})
    small, large = ft_sides[0], ft_sides[-1]
    seen = {}

    def recording(ft):
        @contextlib.contextmanager
        def factory():
            with device.finetune_context(ft):
                seen[ft] = torch.cuda.current_stream().cuda_stream
                yield
        return factory

    job = write_tiny_job(tmp_path / "job", num_layers=2)
    measured = FinetuneProfiler(job, 1, 20.0, device.finetune_device).measure_partitions(
        {small: recording(small), large: recording(large)})
    for ft in (small, large):
        infer = max(i for i, f in device.partitions.pairs if f == ft)
        assert seen[ft] == device.partitions.streams(infer, ft)[1].cuda_stream
        assert measured[ft].throughput.tokens_per_s_solo > 0 and measured[ft].num_tokens > 0
