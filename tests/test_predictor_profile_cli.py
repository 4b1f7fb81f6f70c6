"""`harvest profile --co-run` end to end on a tiny Llama: real worker pinned per visit to this host's core
partitions, real finetune engine, a loadable co-run profile. The co-run run is the solo run's path (worker,
visits, fit, the job alone on the whole device) plus pinning, co-run visits, stage 2 and per-partition finetune
rates; the solo-only grid is checked in test_profile_partitions.py. The GPU form: test_profile_gpu.py."""

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import free_port

from harvest.finetune.demo.tiny_job import write_tiny_job
from harvest.replay.finetune_rates import FinetuneRates
from predictor.profile import Profile
from predictor.samples import load_samples

pytestmark = pytest.mark.sglang

NUM_CORES = len(os.sched_getaffinity(0))


@pytest.mark.skipif(NUM_CORES < 2, reason="core partitions need two cores")
def test_profile_co_run_measures_one_step_records_every_core_partition_and_the_finetune_rates(
        tmp_path, tiny_model_dir, harvest_cli):
    """Pins what a profile needs: step records time one step each (the overlap scheduler's records span
    two; forced by comparing latency with the interval between step ends), repository-relative paths (forced
    by running from a directory that holds the outputs), solo and co-run samples of every core partition,
    and the finetune job's rates: co-run beside decode and alone per finetune partition, and alone on the
    whole device, which the simulator and the planner read."""
    # The job trains in the worker through every visit: it must not finish first.
    job = write_tiny_job(tmp_path / "job", num_layers=2, max_steps=100_000, save_steps=100_000)
    out = subprocess.run(
        [*harvest_cli, "profile", "--co-run", "--model-path", str(tiny_model_dir), "--out", "profiles/tiny.json",
         "--finetune", str(job.relative_to(tmp_path)), "--finetune-steps", "1", "--max-batch-size", "6",
         "--max-seq-len", "64", "--seq-levels", "2", "--passes", "1", "--repeats", "3", "--held-out", "1",
         "--dtype", "float32", "--port", str(free_port()), "--admin-port", str(free_port())],
        # Just under the sglang mark's bound: from a cold inductor cache the job's compile at nice 19 alone takes
        # minutes beside the other test process.
        cwd=tmp_path, capture_output=True, text=True, timeout=1700, check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["step_latency_over_interval_p50"] < 1.5  # a record spanning two steps reads ~2
    assert summary["device"].startswith("CPU") and summary["dropped_partitions"] == []
    assert summary["dtype"] == "float32" and "dtype='float32'" in Path(summary["worker_log"]).read_text()
    profile = Profile.load(tmp_path / "profiles" / "tiny.json")
    assert profile.samples_source.path == "profiles/tiny.samples.csv"
    assert profile.finetune_config_id == str(job.relative_to(tmp_path))
    assert profile.num_sms == NUM_CORES and profile.latency_model.has_colo
    samples = load_samples(tmp_path / "profiles" / "tiny.samples.csv")
    assert summary["num_fit_samples"] == len(samples)
    assert {round(s.infer_sm_ratio * NUM_CORES) for s in samples if s.is_solo} == set(range(1, NUM_CORES + 1))
    assert sum(not s.is_solo for s in samples) >= 4                     # stage 2's minimum
    assert len(load_samples(tmp_path / "profiles" / "tiny.samples.visits.csv")) == len(samples)  # one pass
    assert sorted(p.name for p in (tmp_path / "profiles").iterdir()) == [
        "tiny.held_out.csv", "tiny.held_out.visits.csv", "tiny.json", "tiny.samples.csv", "tiny.samples.visits.csv"]
    *co_run, whole = profile.finetune_throughput
    assert whole.ft_sms == NUM_CORES and whole.tokens_per_s_colo is None
    assert whole.tokens_per_s_solo > 0 and whole.samples_per_s_solo > 0 and whole.unit_ms > 0
    assert co_run and all(0 < t.ft_sms < NUM_CORES and t.tokens_per_s_colo > 0 and t.tokens_per_s_solo > 0
                          for t in co_run)
    rates = FinetuneRates.from_profile(profile)
    assert rates.whole_device_tokens_per_s == whole.tokens_per_s_solo
    assert rates.colo(co_run[0].ft_sms) == co_run[0].tokens_per_s_colo
