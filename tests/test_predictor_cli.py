"""`harvest predictor fit|eval` and `harvest bench predictor` through the real CLI entry point."""

import json

import pytest

from harvest.cli.main import main
from predictor.partition_grid import PartitionGrid
from predictor.profile import Profile
from predictor.samples import write_samples
from predictor.sampling_plan import SamplingPlan
from predictor.synthetic_device import SyntheticDevice


@pytest.fixture(scope="module")
def sample_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    grid = PartitionGrid.from_name("h100")
    device = SyntheticDevice(grid)
    plan = SamplingPlan(grid, 64, 1024)
    write_samples(root / "fit.csv", device.measure(plan.fit_points))
    write_samples(root / "held.csv", device.measure(plan.held_out_points, seed=1))
    return root


def test_fit_then_eval(sample_files, capsys):
    out = sample_files / "p.json"
    args = ["predictor", "fit", "--samples", str(sample_files / "fit.csv"), "--out", str(out), "--device", "h100"]
    assert main(args + ["--held-out", str(sample_files / "held.csv"), "--model", "llama"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["colo_form"] == "eq5_bandwidth" and summary["plateau_batch_size"] == 4
    profile = Profile.load(out)
    assert profile.model == "llama" and profile.held_out_metrics[1].n > 0
    assert main(["predictor", "eval", "--profile", str(out), "--samples", str(sample_files / "held.csv")]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["n"] == result["solo"]["n"] + result["colo"]["n"]
    assert 0 < result["solo"]["mape"] <= result["solo"]["max_ape"] < 10
    assert 0 < result["colo"]["mape"] <= result["colo"]["max_ape"] < 10
    assert "residuals" not in result
    assert main(["predictor", "eval", "--profile", str(out), "--samples", str(sample_files / "held.csv"),
                 "--residuals"]) == 0
    residuals = json.loads(capsys.readouterr().out)["residuals"]
    assert len(residuals) == result["n"]
    assert max(abs(r["error_pct"]) for r in residuals) == pytest.approx(
        max(result["solo"]["max_ape"], result["colo"]["max_ape"]), abs=0.01)


def test_bad_input_is_one_line_and_exit_2(sample_files, tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("infer_sm_ratio,ft_sm_ratio,batch_size,seq_len,latency_ms\n1.0,0,4,128,oops\n")
    assert main(["predictor", "fit", "--samples", str(bad), "--out", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{bad}:2: latency_ms is not a number" in err
    fit_csv = str(sample_files / "fit.csv")
    assert main(["predictor", "fit", "--samples", fit_csv, "--out", str(tmp_path / "p.json")]) == 2
    assert "pass --device or --num-sms" in capsys.readouterr().err
    assert main(["predictor", "eval", "--profile", fit_csv, "--samples", fit_csv]) == 2
    assert "not valid JSON" in capsys.readouterr().err


def test_bench_prints_decision_timing(capsys):
    assert (
        main(["bench", "predictor", "--num-decisions", "20000", "--max-batch-size", "64", "--max-seq-len", "1024"]) == 0
    )
    result = json.loads(capsys.readouterr().out)
    assert result["num_candidates"] == 121
    assert 0 < result["decision_us_mean"] <= result["plan_and_observe_us_mean"] and result["decision_us_p99"] > 0
    assert 0 < result["fraction_co_run"] < 1
    assert result["profile_is_synthetic"] is True and "synthetic" in result["profile_device"]


def test_bench_on_a_measured_profile_says_it_is_not_synthetic(capsys):
    measured = "predictor/profiles/cpu-smollm2-135m.json"
    assert main(["bench", "predictor", "--profile", measured, "--num-decisions", "2000", "--tpot-ms", "300"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["profile"].startswith(measured) and result["profile_is_synthetic"] is False
