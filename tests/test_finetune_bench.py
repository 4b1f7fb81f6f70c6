"""`harvest bench finetune --tiny`: both engines run and the result carries the side-by-side numbers."""

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LLAMAFACTORY_VERBOSITY", "WARN")

import pytest
import torch

from harvest.finetune import bench


# --compiled-run compiles every layer graph at nice 19 (compiled_layers.COMPILE_NICE): from a fresh clone's cold
# inductor cache that is about two minutes of CPU, and beside the other test process it gets the CPU last.
@pytest.mark.timeout(600)
def test_bench_tiny_reports_both_engines_and_identical_losses():
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    previous = torch.get_num_threads()
    try:
        result = bench.run(parser.parse_args(["--tiny", "--max-steps", "3", "--num-threads", "1", "--compiled-run"]))
    finally:
        torch.set_num_threads(previous)
    assert result["steps"] == 3
    assert result["llamafactory"]["tokens_per_s"] > 0 and result["harvest"]["tokens_per_s"] > 0
    assert result["max_loss_rel_diff"] < 1e-4
    compiled = result["harvest_compiled"]
    assert compiled["tokens_per_s"] > 0 and compiled["max_loss_rel_diff"] < 1e-4
    window = result["harvest_window1"]
    # Shrinking a 1-layer window frees that layer's frozen weights (how fast is the benchmark's to say).
    assert window["shrink_freed_bytes"] > 0 and window["shrink_ms"] > 0
    copy, shared = result["base_weights"]["copy"], result["base_weights"]["shared"]
    assert copy["mode"] == "copy" and shared["mode"] == "shared", shared["reason"]
    # With its own copy the job holds every frozen weight once (host copies) and its resident layers again.
    assert copy["frozen_bytes"] > shared["bytes_saved"] > 0 and shared["frozen_bytes"] == 0
    assert copy["trainable_bytes"] == shared["trainable_bytes"] > 0
