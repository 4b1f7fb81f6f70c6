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
