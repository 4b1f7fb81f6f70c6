"""`harvest bench finetune --tiny`: both engines run and the result carries the side-by-side numbers."""

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LLAMAFACTORY_VERBOSITY", "WARN")

import pytest
import torch

from harvest.finetune import bench


def test_bench_tiny_reports_both_engines_and_identical_losses():
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    previous = torch.get_num_threads()
    try:
        result = bench.run(parser.parse_args(["--tiny", "--max-steps", "3", "--num-threads", "1"]))
    finally:
        torch.set_num_threads(previous)
    assert result["steps"] == 3
    assert result["llamafactory"]["tokens_per_s"] > 0 and result["harvest"]["tokens_per_s"] > 0
    speedup = result["harvest"]["tokens_per_s"] / result["llamafactory"]["tokens_per_s"]
    assert result["harvest"]["vs_llamafactory"] == pytest.approx(speedup)
    assert result["max_loss_rel_diff"] < 1e-4
    window = result["harvest_window1"]
    # Shrinking a 1-layer window frees that layer's frozen weights, host-side, well within one decode step.
    assert window["shrink_freed_bytes"] > 0 and 0 < window["shrink_ms"] < 1000
