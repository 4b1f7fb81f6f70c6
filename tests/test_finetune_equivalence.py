"""Acceptance: harvest's layer-wise engine reproduces LlamaFactory's own training (same YAML, seed, data).

LlamaFactory runs in-process through `llamafactory.train.tuner.run_exp`, exactly what `llamafactory-cli
train` calls; harvest runs the same YAML. fp32 on CPU, tiny random Llama, demo dataset (unequal lengths,
so batches are padded).
"""

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LLAMAFACTORY_VERBOSITY", "WARN")

import pytest
import torch
import yaml
from safetensors.torch import load_file

from harvest.finetune import FinetuneConfig, FinetuneEngine
from harvest.finetune.demo.tiny_job import write_tiny_job

pytestmark = pytest.mark.usefixtures("one_torch_thread")


CASES = {
    # padded batches of 4, accumulation over 2, warmup + cosine, a clip norm small enough to clip every step
    "padded_accumulated_clipped": {
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 2,
        "max_steps": 6,
        "lr_scheduler_type": "cosine",
        "warmup_steps": 2,
        "max_grad_norm": 0.05,
    },
    # one unpadded row per step, no accumulation, constant LR, LoRA dropout (the same masks must be drawn)
    "single_row_dropout": {
        "per_device_train_batch_size": 1,
        "gradient_accumulation_steps": 1,
        "max_steps": 5,
        "lr_scheduler_type": "constant",
        "lora_dropout": 0.1,
    },
    # epochs instead of max_steps: 20 samples in batches of 3 -> 7 batches (the last of 2 rows), accumulated
    # 3 + 3 + 1 (an uneven last window) -> 3 steps per epoch, and a second epoch in a reshuffled order: 6 steps
    "epochs_uneven_window": {
        "per_device_train_batch_size": 3,
        "gradient_accumulation_steps": 3,
        "max_samples": 20,
        "max_steps": -1,
        "num_train_epochs": 2,
    },
}


def run_llamafactory(job_path) -> tuple[list[float], dict]:
    from llamafactory.train.tuner import run_exp

    job = yaml.safe_load(job_path.read_text())
    job["output_dir"] = job["output_dir"] + "-llamafactory"
    job["overwrite_output_dir"] = True
    run_exp(job)
    lines = Path(job["output_dir"], "trainer_log.jsonl").read_text().splitlines()
    losses = [json.loads(line)["loss"] for line in lines if '"loss"' in line]
    return losses, load_file(Path(job["output_dir"], "adapter_model.safetensors"))


def run_harvest(job_path, config: FinetuneConfig | None = None) -> tuple[list[float], dict]:
    engine = FinetuneEngine.from_yaml(job_path, config=config)
    losses = []
    while not engine.is_finished:
        losses.append(engine.run_step().loss)
    engine.close()
    return losses, load_file(engine.llamafactory.output_dir / "adapter_model.safetensors")


def num_padded_batches(job_path) -> int:
    """Batches of the first epoch, in training order, whose rows hold unequal numbers of real tokens."""
    dataloader = FinetuneEngine.from_yaml(job_path).setup.dataloader
    dataloader.set_epoch(0)  # the Trainer's seedable sampler: epoch 0 is the order both runs trained on
    return sum(len(set(batch["attention_mask"].sum(dim=1).tolist())) > 1 for batch in dataloader)


def assert_same_training(expected, actual):
    expected_losses, expected_weights = expected
    actual_losses, actual_weights = actual
    assert len(actual_losses) == len(expected_losses) >= 5
    assert actual_losses == pytest.approx(expected_losses, rel=1e-4)
    assert actual_weights.keys() == expected_weights.keys()
    assert any(w.abs().max() > 0 for k, w in expected_weights.items() if "lora_B" in k)  # training moved B
    for key, weight in expected_weights.items():
        assert torch.allclose(actual_weights[key], weight, rtol=1e-4), key


@pytest.mark.parametrize("case", sorted(CASES))
def test_losses_and_adapter_match_llamafactory(tmp_path, case):
    job_path = write_tiny_job(tmp_path, **CASES[case])
    assert_same_training(run_llamafactory(job_path), run_harvest(job_path))
    if case == "padded_accumulated_clipped":
        assert num_padded_batches(job_path) > 0


def test_row_sliced_units_with_one_resident_layer_match_llamafactory(tmp_path):
    """Pins that splitting micro-batches into 1-row units and swapping every layer changes nothing."""
    job_path = write_tiny_job(tmp_path, num_layers=3, **CASES["padded_accumulated_clipped"])
    config = FinetuneConfig(num_window_layers=1, max_slice_rows=1)
    assert_same_training(run_llamafactory(job_path), run_harvest(job_path, config))
