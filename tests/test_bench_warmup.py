"""`harvest bench warmup --tiny`: each kind's first unit with and without the engine's warm-up, a fresh process
per run."""

import argparse

import pytest

from harvest.bench import warmup


def run_bench(*argv: str) -> dict:
    parser = argparse.ArgumentParser()
    warmup.add_arguments(parser)
    return warmup.run(parser.parse_args(["--tiny", "--num-threads", "1", *argv]))


@pytest.mark.trainer
def test_each_setting_runs_in_its_own_process_and_reports_every_kinds_first_unit():
    result = run_bench("--rounds", "1", "--steps", "2")
    off, on = result["runs"]
    assert (off["warm_up"], on["warm_up"]) == (False, True)
    assert off["warmup_ms"] is None and off["warmup_unit_ms"] == {}
    assert on["warmup_ms"] > 0 and set(on["warmup_unit_ms"]) >= {"embed", "forward", "head", "backward"}
    for run in result["runs"]:
        assert {"embed", "forward", "head", "recompute", "backward"} <= set(run["kinds"])
        assert all(t["first_ms"] > 0 and t["p50_ms"] > 0 and t["n"] >= 2 for t in run["kinds"].values())
    assert set(result["first_over_p50"]) == {"off", "on"} and result["verdict"].startswith("with the warm-up")


def test_bad_flags_are_one_line():
    with pytest.raises(SystemExit, match="--steps must be >= 2"):
        run_bench("--steps", "1")
    with pytest.raises(SystemExit, match="--bound-ms: 'fast' is neither"):
        run_bench("--bound-ms", "fast")
