"""`harvest bench units --tiny`: the engine alone at a bound and uncut, side by side in one process."""

import argparse

import pytest
import torch

from harvest.bench import units


def run_bench(*argv: str) -> dict:
    parser = argparse.ArgumentParser()
    units.add_arguments(parser)
    previous = torch.get_num_threads()
    try:
        return units.run(parser.parse_args(["--tiny", "--num-threads", "1", *argv]))
    finally:
        torch.set_num_threads(previous)


def test_a_bound_cuts_units_counts_those_over_it_and_trains_the_same_tokens():
    result = run_bench("--steps", "2", "--warmup-steps", "1", "--bound-ms", "0.05", "--bound-ms", "none")
    bounded, uncut = result["runs"]
    assert (bounded["bound_ms"], uncut["bound_ms"]) == (0.05, None)
    # Cutting changes how the steps are run, not what they train: the same samples, the same tokens.
    assert bounded["num_tokens"] == uncut["num_tokens"] > 0
    assert bounded["num_units"] > uncut["num_units"]
    for run in result["runs"]:
        assert run["num_units"] == sum(kind["n"] for kind in run["units"].values())
        assert run["over_bound"] == sum(kind["over"] for kind in run["units"].values())
        assert {"embed", "forward", "head", "backward"} <= set(run["units"])
    assert uncut["over_bound"] == 0
    # Hardly a unit of this job runs in 50 us on a CPU: most are over such a bound, and the verdict says so.
    assert bounded["over_bound"] > bounded["num_units"] // 2
    assert result["verdict"].startswith("misses")


def test_a_bad_bound_is_one_line():
    with pytest.raises(SystemExit, match="--bound-ms: 'fast' is neither a number of ms nor none"):
        run_bench("--bound-ms", "fast")
