"""`harvest bench allocator` on the host backend: the JSON keys, and fragmentation within 5% of lent
bytes on SmolLM2-135M's layer-wise LoRA finetune pattern (HARLI: under 100 MB)."""

import argparse
import json
import subprocess
import sys

from allocator import bench
from allocator.finetune_pattern import FinetunePattern
from allocator.small_pool import max_small_bytes, small_pool_bytes_from_profile


def run_bench(*argv: str) -> dict:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return bench.run(parser.parse_args(list(argv)))


def test_fragmentation_on_the_embedded_models_finetune_pattern_is_within_five_percent():
    result = run_bench("--repeats", "3", "--churn-rounds", "30")
    assert {"lend_us_per_chunk", "reclaim_us_per_chunk", "small_alloc_us", "fragmentation_pct"} <= set(result)
    assert result["lend_us_per_chunk"] > 0 and result["reclaim_us_per_chunk"] > 0 and result["small_alloc_us"] > 0
    fragmentation = result["fragmentation"]
    assert fragmentation["lent_mib"] > 0 and fragmentation["used_mib"] > 0
    assert result["fragmentation_pct"] <= 5.0
    assert fragmentation["max_bytes"] < 100 * 2**20


def test_small_pool_is_sized_from_the_profile_peak():
    pattern = FinetunePattern()
    block_bytes = 6 << 20
    sizes = [n for _, n in pattern.allocations()]
    small = [n for n in sizes if n <= max_small_bytes(block_bytes)]
    assert small and len(small) < len(sizes)
    pool_bytes = small_pool_bytes_from_profile(sizes, block_bytes, headroom=0.0)
    assert sum(small) <= pool_bytes <= 2 * sum(small)
    # Freeing everything before the next wave keeps the peak at one wave.
    assert small_pool_bytes_from_profile(small + [-n for n in small] + small, block_bytes, 0.0) == pool_bytes


def test_harvest_bench_allocator_prints_one_json_object():
    result = subprocess.run([sys.executable, "-m", "harvest.cli.main", "bench", "allocator", "--repeats", "2",
                             "--churn-rounds", "2"], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    printed = json.loads(result.stdout)
    assert printed["fragmentation_pct"] >= 0 and "lend_us_per_chunk" in printed
