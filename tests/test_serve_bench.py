"""`harvest bench serve` on the tiny model, a smoke test of the benchmark: both workers start and decode the
same streamed workload, and harvest's hook inside one of them counted its steps. What the ratio is, and
whether it meets the 1.02 target, is the benchmark's to say on the embedded model (eval/README.md)."""

import argparse
import math

import pytest

from harvest.bench import serve as bench_serve

pytestmark = pytest.mark.sglang

NUM_REQUESTS = 2
MAX_NEW_TOKENS = 16
ROUNDS = 2


def test_bench_serve_measures_both_workers_on_the_same_workload(tiny_model_dir, tmp_path):
    parser = argparse.ArgumentParser()
    bench_serve.add_arguments(parser)
    args = parser.parse_args(["--model-path", str(tiny_model_dir), "--num-requests", str(NUM_REQUESTS),
                              "--max-new-tokens", str(MAX_NEW_TOKENS), "--prompt-len", "16",
                              "--rounds", str(ROUNDS), "--max-total-tokens", "4096",
                              "--log-dir", str(tmp_path)])

    result = bench_serve.run(args)

    for name in ("harvest", "plain"):
        worker = result[name]
        assert worker["num_tokens"] == ROUNDS * NUM_REQUESTS * MAX_NEW_TOKENS
        assert worker["num_timed_steps"] > 0 and worker["num_token_gaps"] >= worker["num_timed_steps"]
        assert 0 < worker["step_ms_p50"] <= worker["step_ms_p90"]
        assert worker["tpot_ms_p50"] > 0
        assert len(worker["step_ms_p50_per_round"]) == ROUNDS
    assert len(result["per_round_ratios"]) == ROUNDS
    for key in ("ratio_step_ms_p50", "ratio_step_ms_p50_pooled", "ratio_tpot_ms_p50"):
        assert math.isfinite(result[key]) and result[key] > 0
    assert result["ratio_of"] == "harvest / plain"
    # harvest's own step hook saw the measured rounds: at least one step per decoded token of the longest
    # request, that is every token but the first, which comes with the prefill (fake transfer metadata).
    assert result["harvest"]["hook_num_steps"] >= ROUNDS * (MAX_NEW_TOKENS - 1)
    assert "--disaggregation-mode decode" in result["sglang_argv"]
    assert result["device"] and result["date"] and result["command"].startswith("harvest bench serve")
