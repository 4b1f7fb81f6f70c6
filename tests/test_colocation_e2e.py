"""The product end to end on CPU: the embedded model's decode worker with a LoRA job inside, under a TPOT
SLO, serving a slice of the Azure conv trace; failure isolation; the admin pause/resume API."""

import json
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml
from conftest import free_port, wait_for_stats

from harvest.finetune.demo.make_dataset import DATASET_NAME, DEMO_DIR
from harvest.models import ensure_embedded_model
from harvest.replay.live_replay import LiveReplay
from harvest.worker.client import (
    read_last_step_seq,
    read_stats,
    read_steps_since,
)
from harvest.worker.process import WorkerProcess
from traces.trace import Trace
from traces.trace_loader import load_trace

pytestmark = pytest.mark.sglang

# A slice of the conv trace the 2-core CPU can serve with the 135M model: 90 s of trace at a tenth of its
# rate (~45 requests), lengths capped to what keeps a decode step near 100 ms.
TRACE_START_S, TRACE_WINDOW_S, RATE_SCALE = 600.0, 90.0, 0.1
MAX_CONTEXT_TOKENS, MAX_GENERATED_TOKENS = 256, 48
EPOCH_SAMPLES = 8
REFERENCE_STEP_MS = 30.0
"""The batch-1 decode step (median) on the hosts this slice's rate was set on: 23-35 ms in the 7 paused
references of eval/results/cpu-2026-11-2{3,4}/e2e-slo-runs/. A host 3x slower (2026-11-25, here and in CI:
87 ms) at the same rate decodes 99 % of the time, so there is no slack to harvest: the rate is scaled down by
how much slower the host is, and the test poses the same problem on it (eval/README.md, "Temporal slice")."""


def conv_slice(rate_scale: float = RATE_SCALE):
    trace = load_trace("conv").window(TRACE_START_S, TRACE_WINDOW_S / RATE_SCALE).scale_rate(rate_scale)
    return trace.window(0, TRACE_WINDOW_S).cap_lengths(MAX_CONTEXT_TOKENS, MAX_GENERATED_TOKENS)


def batch_one_step_ms(worker: WorkerProcess) -> float:
    """The median decode step of one request alone, at the slice's longest lengths: the host's speed."""
    since = read_last_step_seq(worker.admin_url)
    probe = Trace("probe", np.zeros(1), np.array([MAX_CONTEXT_TOKENS]), np.array([MAX_GENERATED_TOKENS]))
    LiveReplay(worker.url, worker.admin_url, 1e9).run(probe)
    return float(np.median([s["latency_ms"] for s in read_steps_since(worker.admin_url, since)
                            if s["batch_size"] == 1]))


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


def replay_steps(worker: WorkerProcess, tpot_slo_ms: float, rate_scale: float = RATE_SCALE) -> list[dict]:
    since = read_last_step_seq(worker.admin_url)
    LiveReplay(worker.url, worker.admin_url, tpot_slo_ms, max_concurrency=16).run(conv_slice(rate_scale))
    return read_steps_since(worker.admin_url, since)


@pytest.mark.timing
def test_finetune_harvests_slack_within_the_tpot_slo(tmp_path):
    """Decode alone first: the conv slice (its rate scaled to the host's speed, REFERENCE_STEP_MS) on a worker
    whose LoRA job is built, holds its lent KV memory and is paused gives the step latency at that load (its
    99th percentile: the level decode alone keeps).
    Target = 1.5 x that. Then the same slice on a worker with the job running: >= 99% of steps, each
    charged with the finetune time that ran after it, within the target; the job made optimizer steps and
    its loss fell. The reference worker carries the job paused, not no job, so that what the controller
    is judged on is what it decides (harvest's fixed cost on decode steps, measured in eval/README.md
    "Decode alone beside a paused job", is the same in both runs)."""
    model_dir = ensure_embedded_model()
    # Eight samples, four optimizer steps an epoch: the loss is compared over the same samples, epoch to epoch
    # (on 256 samples, the first 5 of 11 steps against the last 5 differed by the samples: 0.3 to 2.4 each).
    job = write_job(tmp_path, model_dir, max_samples=EPOCH_SAMPLES)
    with start_worker(model_dir, tmp_path, "solo", "--finetune", str(job), "--tpot-slo-ms", "1e9") as solo:
        wait_for_stats(solo.admin_url, lambda s: s["finetune"]["state"] == "running", "the job running")
        assert httpx.post(f"{solo.admin_url}/harvest/finetune/pause").json()["state"] == "paused"
        step_ms = batch_one_step_ms(solo)
        rate_scale = RATE_SCALE * min(1.0, REFERENCE_STEP_MS / step_ms)
        solo_steps = replay_steps(solo, 1e9, rate_scale)
        assert read_stats(solo.admin_url)["finetune"]["state"] == "paused"
    assert sum(s["finetune_tokens"] for s in solo_steps[1:]) == 0  # the first may follow a unit begun before the pause
    solo_ms = float(np.percentile([s["latency_ms"] for s in solo_steps], 99))
    tpot_slo_ms = 1.5 * solo_ms

    with start_worker(model_dir, tmp_path, "colo", "--finetune", str(job), "--tpot-slo-ms", f"{tpot_slo_ms:.1f}") as w:
        wait_for_stats(w.admin_url, lambda s: s["finetune"]["state"] == "running", "the job running")
        steps = replay_steps(w, tpot_slo_ms, rate_scale)
        stats = read_stats(w.admin_url)

    within = [s["latency_ms"] + s["finetune_ms"] + s["idle_wait_ms"] <= tpot_slo_ms for s in steps]
    (tmp_path / "steps.json").write_text(json.dumps({"solo": solo_steps, "colo": steps}))
    print(json.dumps({"batch_one_step_ms": step_ms, "rate_scale": rate_scale, "solo_p99_ms": solo_ms,
                      "tpot_slo_ms": tpot_slo_ms, "num_steps": len(steps),
                      "attainment": sum(within) / len(within),
                      "violations_by_decode_alone": sum(s["latency_ms"] > tpot_slo_ms for s in steps),
                      "violations_with_idle_wait": sum(s["idle_wait_ms"] > 0 and s["latency_ms"] + s["finetune_ms"]
                                                       + s["idle_wait_ms"] > tpot_slo_ms for s in steps),
                      "finetune": stats["finetune"], "colocation": stats["colocation"], "memory": stats["memory"]},
                     indent=1))
    assert len(steps) > 100
    assert sum(within) / len(within) >= 0.99
    assert sum(s["finetune_ms"] > 0 for s in steps) > 0, "no finetune unit ever ran in a step's slack"
    losses = [json.loads(line)["loss"] for line in (tmp_path / "adapter" / "finetune_log.jsonl").open()]
    assert len(losses) >= 10, f"only {len(losses)} finetune steps while serving"
    assert stats["memory"]["kv_lending"] == "on" and stats["memory"]["chunks_lent"] > 0, stats["memory"]
    epoch_steps = EPOCH_SAMPLES // 2  # per_device_train_batch_size 2
    assert np.mean(losses[-epoch_steps:]) < np.mean(losses[:epoch_steps]), f"loss did not fall: {losses}"


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


def test_pause_resume_and_admin_auth(tmp_path, tiny_model_dir):
    job = write_job(tmp_path, tiny_model_dir, max_steps=100_000, save_steps=1000)
    token = "s3cret-token"
    with start_worker(tiny_model_dir, tmp_path, "admin", "--finetune", str(job), "--tpot-slo-ms", "500",
                      "--max-total-tokens", "4096", "--admin-token", token) as worker:
        wait_for_stats(worker.admin_url, lambda s: s["finetune"]["state"] == "running", "the job running")
        base = f"{worker.admin_url}/harvest/finetune"
        assert httpx.post(f"{base}/pause").status_code == 401
        assert httpx.post(f"{base}/pause", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.post(f"{base}/pause", headers={"Authorization": token}).status_code == 401
        auth = {"Authorization": f"Bearer {token}"}
        assert httpx.post(f"{base}/explode", headers=auth).status_code == 404
        assert httpx.get(f"{base}/pause").status_code == 405

        paused = httpx.post(f"{base}/pause", headers=auth)
        assert paused.status_code == 200 and paused.json()["state"] == "paused"
        units = read_stats(worker.admin_url)["finetune"]["num_units"]
        time.sleep(3)
        assert read_stats(worker.admin_url)["finetune"]["num_units"] <= units + 1  # one may have been running
        resumed = httpx.post(f"{base}/resume", headers=auth)
        assert resumed.status_code == 200 and resumed.json()["state"] in ("running", "waiting", "starved")
        time.sleep(3)
        assert read_stats(worker.admin_url)["finetune"]["num_units"] > units + 1
