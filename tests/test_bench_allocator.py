"""`harvest bench allocator` on the host backend, replaying the allocation pattern recorded from a real
finetune engine run: fragmentation within 5 % of lent bytes (HARLI: under 100 MB), and the roofline-style
figure (reclaim time per MiB against one decode step's budget) consistent with the timings it comes from."""

import argparse
import json
import re
import subprocess
import sys

import pytest

from harvest.bench import allocator as bench
from harvest.bench.weight_pattern import ALLOC, FREE, UNIT_END, load_pattern


def run_bench(*argv: str) -> dict:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return bench.run(parser.parse_args(list(argv)))


def test_shipped_pattern_is_a_recorded_engine_run_that_frees_all_it_allocates():
    pattern = load_pattern()
    assert "FinetuneEngine" in pattern["source"]
    allocated = [e[1] for e in pattern["events"] if e[0] == ALLOC]
    freed = [e[1] for e in pattern["events"] if e[0] == FREE]
    assert allocated and sorted(allocated) == sorted(freed) == list(range(len(allocated)))
    assert sum(e[0] == UNIT_END for e in pattern["events"]) > 0


def test_fragmentation_on_the_recorded_finetune_pattern_is_within_five_percent():
    result = run_bench("--repeats", "3")
    assert result["lend_us_per_chunk"] > 0 and result["reclaim_us_per_chunk"] > 0 and result["small_alloc_us"] > 0
    fragmentation = result["fragmentation"]
    assert fragmentation["peak_lent_mib"] >= fragmentation["peak_used_mib"] > 0
    assert 0 <= result["fragmentation_pct"] <= 5.0
    assert fragmentation["max_bytes"] < 100 * 2**20
    chunk_mib = result["geometry"]["chunk_mib"]
    assert result["reclaim_ms_per_mib"] * chunk_mib * 1e3 == pytest.approx(result["reclaim_us_per_chunk"])
    assert result["reclaim_mib_within_step_budget"] == pytest.approx(40.0 / result["reclaim_ms_per_mib"])
    assert result["reclaim_peak_fraction_of_step_budget"] == pytest.approx(result["reclaim_peak_ms"] / 40.0)


def test_harvest_bench_allocator_prints_one_json_object():
    result = subprocess.run([sys.executable, "-m", "harvest.cli.main", "bench", "allocator", "--repeats", "2"],
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    printed = json.loads(result.stdout)
    assert printed["fragmentation_pct"] == printed["fragmentation"]["max_pct"] <= 5.0
    assert printed["step_budget_ms"] == 40.0 and printed["reclaim_ms_per_mib"] > 0
    assert re.search(r"reclaim\s+[0-9.]+\s+ms/MiB:\s+[0-9]+\s+MiB\s+reclaimed\s+within\s+one\s+40\s+ms\s+step",
                     result.stderr), result.stderr[-2000:]
