"""Shared base weights on a real CPU worker (issue 13): a job on the served model computes on SGLang's resident
tensors in place, trains as LlamaFactory's own trainer does with the same YAML in the serving dtype, and never
writes a served tensor.

The worker serves the tiny Llama in float32 (`--dtype float32`), the dtype LlamaFactory loads it in on a CPU
host, so the served tensors are the checkpoint's bit for bit: the checkpoint is the served weights' state
before any step. SGLang's own `/get_weights_by_name` (the route RL frameworks check weight updates with)
reads them back from the worker, fused layouts split by SGLang's code, not harvest's.
"""

import hashlib
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx
import pytest
import torch
import yaml
from conftest import free_port
from safetensors.torch import load_file
from test_finetune_equivalence import (
    CASES,
    assert_same_training,
    num_padded_batches,
    run_llamafactory,
)

from harvest.finetune.demo.tiny_job import write_tiny_job
from harvest.worker.client import wait_for_stats
from harvest.worker.process import WorkerProcess

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def shared_worker(tmp_path_factory):
    work = tmp_path_factory.mktemp("shared")
    job_path = write_tiny_job(work, **CASES["padded_accumulated_clipped"])
    model_dir = yaml.safe_load(job_path.read_text())["model_name_or_path"]
    # KV pool of several chunks (test_kv_lending_e2e.py's flags), so the lender runs and must lend nothing.
    args = ["--model-path", model_dir, "--dtype", "float32", "--max-total-tokens", "8192", "--kv-block-kib", "64",
            "--num-reserved-decode-tokens", "16", "--finetune", str(job_path), "--tpot-slo-ms", "500",
            "--no-finetune-compile"]  # eager: the path compared with LlamaFactory (compiled: test_compiled_layers.py)
    with WorkerProcess(args, free_port(), free_port(), work / "worker.log").start() as worker:
        checkpoint = load_file(next(p for p in os.scandir(model_dir) if p.name.endswith(".safetensors")).path)
        yield worker, job_path, checkpoint, served_digests(worker.url, checkpoint)


def served_tensor(url: str, name: str) -> torch.Tensor:
    response = httpx.post(f"{url}/get_weights_by_name", json={"name": name, "truncate_size": 1 << 20}, timeout=60)
    assert response.status_code == 200, response.text
    return torch.tensor(response.json(), dtype=torch.float32)


def served_digests(url: str, checkpoint: dict) -> dict[str, str]:
    """sha256 of every served tensor's float32 bytes, by checkpoint name (q/k/v and gate/up together cover
    the fused tensors whole; the tiny vocabulary needs no padding rows)."""
    return {name: hashlib.sha256(served_tensor(url, name).numpy().tobytes()).hexdigest() for name in checkpoint}


@pytest.mark.sglang
def test_shared_weights_train_like_llamafactory_and_are_never_written(shared_worker):
    worker, job_path, checkpoint, digests_at_start = shared_worker
    stats = wait_for_stats(worker.admin_url, lambda s: s["finetune"]["state"] == "finished", "the job to finish")
    base_weights = stats["finetune"]["base_weights"]
    assert base_weights["mode"] == "shared", base_weights["reason"]
    assert base_weights["bytes_saved"] == sum(t.numel() * t.element_size() for t in checkpoint.values())
    memory = stats["memory"]
    assert memory["kv_lending"] == "on" and memory["lent_bytes"] == 0 and memory["num_window_grows"] == 0
    assert memory["lends_to"].startswith("nothing: the job computes on the served weights"), memory
    assert stats["finetune"]["step"] == CASES["padded_accumulated_clipped"]["max_steps"]

    # Never written: after every optimizer step, each served tensor is the checkpoint's, as at the start.
    checkpoint_digests = {name: hashlib.sha256(t.numpy().tobytes()).hexdigest() for name, t in checkpoint.items()}
    assert digests_at_start == checkpoint_digests
    assert served_digests(worker.url, checkpoint) == checkpoint_digests

    # Equivalence: the worker's losses (its step log) and adapter against LlamaFactory on the same YAML.
    output_dir = yaml.safe_load(job_path.read_text())["output_dir"]
    with open(os.path.join(output_dir, "finetune_log.jsonl")) as f:
        harvest_losses = [json.loads(line)["loss"] for line in f]
    harvest_adapter = load_file(os.path.join(output_dir, "adapter_model.safetensors"))
    assert_same_training(run_llamafactory(job_path), (harvest_losses, harvest_adapter))
    assert num_padded_batches(job_path) > 0
