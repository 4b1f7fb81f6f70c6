"""`harvest profile --co-run` on a GPU, end to end on a tiny Llama: a worker pinned per visit to green-context
SM partitions, the co-run and per-partition finetune rates, a co-run profile that makes a GPU worker spatial.
The CPU form of the same code path: test_profile_partitions.py (shared pieces) and test_predictor_profile_cli.py."""

import json
import subprocess

import pytest
from conftest import free_port

from harvest.finetune.demo.tiny_job import write_tiny_job
from predictor.profile import Profile

pytestmark = [pytest.mark.gpu, pytest.mark.sglang]


def test_a_gpu_co_run_profile_measures_every_formed_partition_and_its_finetune_rates(tmp_path, tiny_model_dir,
                                                                                   harvest_cli):
    import torch

    from harvest.config import AdminConfig, ServeConfig
    from harvest.finetune import FinetuneConfig
    from harvest.config import Colocation, colocation_mode

    # The job trains in the worker through every visit: it must not finish first (the profiler's own
    # solo runs set their max_steps).
    job = write_tiny_job(tmp_path / "job", num_layers=2, max_steps=100_000, save_steps=100_000)
    out = subprocess.run(
        [*harvest_cli, "profile", "--co-run", "--model-path", str(tiny_model_dir), "--out", "p/gpu.json",
         "--finetune", str(job), "--finetune-steps", "1", "--max-batch-size", "6", "--max-seq-len", "64",
         "--seq-levels", "2", "--passes", "1", "--repeats", "3", "--held-out", "1",
         "--port", str(free_port()), "--admin-port", str(free_port())],
        cwd=tmp_path, capture_output=True, text=True, timeout=1200, check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["device"] == torch.cuda.get_device_name(0)
    assert summary["step_latency_over_interval_p50"] < 1.5  # a record spanning two steps reads ~2 (as the CPU twin)
    profile = Profile.load(tmp_path / "p" / "gpu.json")
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert profile.num_sms == num_sms and profile.latency_model.has_colo
    assert profile.held_out_metrics is not None
    *co_run, whole = profile.finetune_throughput
    assert whole.ft_sms == num_sms and whole.tokens_per_s_colo is None and whole.tokens_per_s_solo > 0
    assert co_run and all(0 < t.ft_sms < num_sms and t.tokens_per_s_colo > 0 and t.tokens_per_s_solo > 0
                          for t in co_run)
    config = ServeConfig(admin=AdminConfig(), finetune=FinetuneConfig("cuda", yaml_path=str(job)), tpot_slo_ms=40.0,
                         profile_path=str(tmp_path / "p" / "gpu.json"))
    assert colocation_mode(config, profile) is Colocation.SPATIAL
