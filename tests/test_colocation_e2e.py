"""The product end to end on CPU: a decode worker with a LoRA job inside under a TPOT target, serving a
window of the Azure conv trace (`harvest bench slo`, reduced); failure isolation. (Admin auth and pause/resume:
tests/test_finetune_publish.py, on its worker.)
Whether the steps keep the target is measured by the benchmark and judged deterministically on recorded
timings (tests/test_controller_acceptance.py)."""

import argparse
import json
from pathlib import Path

import pytest
import yaml
from conftest import free_port

from harvest.bench import slo as bench_slo
from harvest.finetune.demo.make_dataset import DATASET_NAME, DEMO_DIR
from harvest.replay.live_replay import LiveReplay
from harvest.step_stats import miss_cause
from harvest.worker.client import read_stats, wait_for_stats
from harvest.worker.process import WorkerProcess
from traces.trace_loader import load_trace

pytestmark = pytest.mark.sglang


def write_job(tmp_path: Path, model_dir: Path, **overrides) -> Path:
    job = {
        "model_name_or_path": str(model_dir), "stage": "sft", "do_train": True, "finetuning_type": "lora",
        "lora_rank": 8, "lora_target": "all", "dataset": DATASET_NAME, "dataset_dir": str(DEMO_DIR),
        "template": "default", "cutoff_len": 64, "max_samples": 256, "per_device_train_batch_size": 2,
        "learning_rate": 1.0e-3, "max_steps": 1000, "save_steps": 10, "output_dir": str(tmp_path / "adapter"),
        "overwrite_output_dir": True, "report_to": "none", "seed": 42, **overrides,
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def start_worker(model_dir, tmp_path, name, *extra) -> WorkerProcess:
    args = ["--model-path", str(model_dir), "--max-total-tokens", "16384", *extra]
    return WorkerProcess(args, free_port(), free_port(), tmp_path / f"{name}.log").start()


def test_bench_slo_classifies_every_miss_and_the_job_never_plans_past_the_target(tiny_model_dir, tmp_path):
    """`harvest bench slo` at reduced scale (the measurement itself is the benchmark's, eval/README.md): decode
    alone beside the paused job trains nothing; with the job running and publishing, every step past the target
    has a cause, none of them the slice as the controller planned it (its admission rule keeps each unit within
    what the step left by the unit's estimate; a unit that outruns its estimate is host noise, counted apart),
    and the job trains and publishes every step (however few steps a slow host trains in the window: the bench
    waits for the version due at its end). The loads' charge to steps: tests/test_finetune_publish.py."""
    parser = argparse.ArgumentParser()
    bench_slo.add_arguments(parser)
    args = parser.parse_args(["--model-path", str(tiny_model_dir), "--window-s", "20", "--max-context-tokens", "96",
                              "--max-generated-tokens", "16", "--max-total-tokens", "4096",
                              "--publish-every-steps", "1", "--log-dir", str(tmp_path)])
    result = bench_slo.run(args)
    steps = json.loads(Path(result["steps_file"]).read_text())
    alone, harvest = result["decode_alone"], result["harvest"]
    assert alone["num_steps"] == len(steps["decode_alone"]) > 0 and harvest["num_steps"] == len(steps["harvest"]) > 0
    assert sum(s["finetune_tokens"] for s in steps["decode_alone"][1:]) == 0  # the first may end a unit begun before
    target = result["tpot_slo_ms"]
    for name, row in (("decode_alone", alone), ("harvest", harvest)):
        missed = [(miss_cause(s, target), s) for s in steps[name] if miss_cause(s, target)]
        assert sum(row["misses_by_cause"].values()) == len(missed) == round((1 - row["steps_within_target"])
                                                                             * row["num_steps"])
        assert row["misses_by_cause"]["slice"] == 0, [m for m in missed if m[0] == "slice"]
    assert harvest["optimizer_steps"] > 0 and harvest["finetune_tokens"] > 0
    published = harvest["published"]
    assert published["num_published"] >= 1 and published["num_failed"] == 0 and published["error"] is None, published
    assert result["verdict"].startswith(("ok", "MISS"))


def test_finetune_failure_leaves_serving_running(tmp_path, tiny_model_dir):
    """A job that passes the up-front config check but fails inside the worker (its LoRA target names no
    module of the model, which only loading the model reveals): the job is `failed` with the error in
    stats, and requests keep completing."""
    job = write_job(tmp_path, tiny_model_dir, lora_target="no_such_module")
    with start_worker(tiny_model_dir, tmp_path, "fail", "--finetune", str(job), "--tpot-slo-ms", "500",
                      "--max-total-tokens", "4096") as worker:
        stats = wait_for_stats(worker.admin_url, lambda s: s["finetune"]["state"] == "failed", "the job failing")
        assert "no_such_module" in stats["finetune"]["error"], stats["finetune"]
        before = read_stats(worker.admin_url)["decode"]["decode_tokens"]
        trace = load_trace("poisson:rate=4,duration=3,seed=1").cap_lengths(32, 8)
        LiveReplay(worker.url, worker.admin_url, 500).run(trace)
        # Every token but each request's first (its prefill's, here the fake transfer's) is a decode forward's.
        decoded = trace.num_generated_tokens - trace.num_requests
        assert read_stats(worker.admin_url)["decode"]["decode_tokens"] - before == decoded
        assert read_stats(worker.admin_url)["finetune"]["state"] == "failed"
