"""`harvest profile` end to end on a tiny Llama: real worker, real finetune engine, a loadable profile."""

import json
import subprocess

import pytest
from conftest import free_port

from harvest.finetune.demo.tiny_job import write_tiny_job
from harvest.replay.finetune_rates import FinetuneRates
from predictor.profile import Profile
from predictor.samples import load_samples

pytestmark = pytest.mark.sglang


def test_profile_measures_one_step_records_and_the_finetune_rate(tmp_path, tiny_model_dir, harvest_cli):
    """Pins three things a CPU profile needs: step records time one step each (the overlap scheduler's
    records span two; forced by profiling through a real worker and comparing latency with the interval
    between step ends), `--finetune` records a solo rate the simulator reads, and the profile names
    repository-relative paths (forced by running from a directory that holds the outputs)."""
    job = write_tiny_job(tmp_path / "job", num_layers=2)
    out = subprocess.run(
        [*harvest_cli, "profile", "--model-path", str(tiny_model_dir), "--out", "profiles/tiny.json",
         "--finetune", str(job.relative_to(tmp_path)), "--finetune-steps", "2",
         "--max-batch-size", "3", "--max-seq-len", "64", "--passes", "1", "--repeats", "3", "--held-out", "2",
         "--port", str(free_port()), "--admin-port", str(free_port())],
        cwd=tmp_path, capture_output=True, text=True, timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["num_fit_samples"] == 3 * 3 and summary["num_held_out_samples"] == 2
    assert 0.7 < summary["step_latency_over_interval_p50"] < 1.4
    profile = Profile.load(tmp_path / "profiles" / "tiny.json")
    assert profile.samples_source.path == "profiles/tiny.samples.csv"
    assert profile.finetune_config_id == str(job.relative_to(tmp_path))
    assert len(load_samples(tmp_path / "profiles" / "tiny.held_out.csv")) == 2
    assert len(load_samples(tmp_path / "profiles" / "tiny.samples.visits.csv")) == 3 * 3  # one pass
    assert sorted(p.name for p in (tmp_path / "profiles").iterdir()) == [
        "tiny.held_out.csv", "tiny.held_out.visits.csv", "tiny.json", "tiny.samples.csv", "tiny.samples.visits.csv"]
    (rate,) = profile.finetune_throughput
    assert rate.ft_sms == 1 and rate.tokens_per_s_colo is None
    assert rate.tokens_per_s_solo > 0 and rate.samples_per_s_solo > 0 and rate.unit_ms > 0
    assert FinetuneRates.from_profile(profile).whole_device_tokens_per_s == rate.tokens_per_s_solo
