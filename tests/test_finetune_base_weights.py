"""The base-weight mode a job runs in: the served model is recognised by fingerprint, not by path, and a job
on it computes on the served tensors in place (shared mode) only where every one of them is the job's own.

Here the served tensors are the checkpoint's, loaded by name (the ServedWeights interface harvest.sglang
fills from a real worker: tests/test_finetune_shared_weights.py)."""

import shutil

import pytest
import torch
from safetensors.torch import load_file

from harvest.finetune import FinetuneConfig, FinetuneEngine
from harvest.finetune.base_weights import (
    ServedWeights,
    base_weight_mode,
    model_fingerprint,
)
from harvest.finetune.demo.tiny_job import write_tiny_job
from harvest.models.tiny_llama import build_tiny_llama

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_a_copy_of_the_served_model_is_the_served_model_and_another_model_is_not(tmp_path):
    served = build_tiny_llama(tmp_path / "served", num_hidden_layers=2)
    copy = shutil.copytree(served, tmp_path / "elsewhere")
    other = build_tiny_llama(tmp_path / "other", num_hidden_layers=1)
    assert model_fingerprint(copy) == model_fingerprint(served) != model_fingerprint(other)

    same = base_weight_mode(copy, served)
    assert same["is_served_model"] and same["mode"] == "copy" and "no access to its resident weights" in same["reason"]
    different = base_weight_mode(other, served)
    assert not different["is_served_model"] and different["mode"] == "copy"
    assert "differs from the served model" in different["reason"]
    assert base_weight_mode(served, None)["reason"] == "no served model (a job outside a worker)"


def test_changed_weight_bytes_change_the_fingerprint(tmp_path):
    served = build_tiny_llama(tmp_path / "served", num_hidden_layers=1)
    changed = shutil.copytree(served, tmp_path / "changed")
    weights = next(changed.glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert model_fingerprint(changed) != model_fingerprint(served)


def served_checkpoint(model_dir) -> dict[str, torch.Tensor]:
    return load_file(next(model_dir.glob("*.safetensors")))


def engine_on(job_path, served_model_dir, tensors, reason_not_shared=None) -> FinetuneEngine:
    config = FinetuneConfig(served_model_path=str(served_model_dir))
    return FinetuneEngine.from_yaml(job_path, config=config, served_weights=ServedWeights(tensors, reason_not_shared))


def test_a_job_on_the_served_model_computes_on_the_served_tensors_and_never_writes_them(tmp_path):
    job_path = write_tiny_job(tmp_path, max_steps=3)
    model_dir = tmp_path / "tiny-llama-2l"
    tensors = served_checkpoint(model_dir)
    before = {name: tensor.clone() for name, tensor in tensors.items()}
    engine = engine_on(job_path, model_dir, tensors)

    stats = engine.stats()["base_weights"]
    assert stats["mode"] == "shared" and stats["is_served_model"]
    assert stats["bytes_saved"] == sum(t.numel() * t.element_size() for t in tensors.values())
    served_ptrs = {t.data_ptr() for t in tensors.values()}
    frozen = [p for p in engine.peft_model.parameters() if not p.requires_grad]
    assert frozen and all(p.data_ptr() in served_ptrs for p in frozen)
    assert engine.stats()["resident_bytes"] == 0 and engine.window_bytes(2) == 0
    assert engine.frozen_bytes() == 0
    assert not engine.shrink_window()  # nothing of the job's own to give back

    losses = [engine.run_step().loss for _ in range(3)]
    assert all(loss > 0 for loss in losses)
    assert any(p.abs().max() > 0 for n, p in engine.peft_model.named_parameters() if "lora_B" in n)
    for name, tensor in tensors.items():
        assert torch.equal(tensor, before[name]), name


@pytest.mark.parametrize("change, reason", [
    ("value", "holds other values than the job's checkpoint"),
    ("dtype", "the worker serves float16, the job loads its base model in float32"),
    ("missing", "the served model has no tensor for the job's frozen model.norm.weight"),
    ("quantized", "the worker serves quantized weights (fp8)"),
])
def test_served_tensors_unlike_the_jobs_keep_the_copy_and_say_why(tmp_path, change, reason):
    job_path = write_tiny_job(tmp_path, max_steps=1)
    model_dir = tmp_path / "tiny-llama-2l"
    tensors = served_checkpoint(model_dir)
    not_shared = None
    if change == "value":
        tensors["model.layers.1.mlp.up_proj.weight"][0, 0] += 1.0
        reason = "the served model.layers.1.mlp.up_proj.weight " + reason
    elif change == "dtype":
        tensors = {name: tensor.half() for name, tensor in tensors.items()}
    elif change == "missing":
        del tensors["model.norm.weight"]
    else:
        not_shared = "the worker serves quantized weights (fp8); the job trains on the checkpoint's"
    engine = engine_on(job_path, model_dir, tensors, not_shared)
    stats = engine.stats()["base_weights"]
    assert stats["mode"] == "copy" and stats["bytes_saved"] == 0 and stats["is_served_model"]
    assert reason in stats["reason"]
    assert engine.run_step().loss > 0


def test_a_job_whose_base_model_differs_from_the_served_one_runs_in_copy_mode_and_says_so(tmp_path):
    job_path = write_tiny_job(tmp_path, max_steps=1)
    served_dir = build_tiny_llama(tmp_path / "served-3l", num_hidden_layers=3)
    engine = engine_on(job_path, served_dir, served_checkpoint(served_dir))
    stats = engine.stats()["base_weights"]
    assert stats["mode"] == "copy" and not stats["is_served_model"]
    assert "differs from the served model" in stats["reason"]
    assert engine.run_step().loss > 0
    assert engine.stats()["resident_bytes"] > 0  # its own copy, resident in the window
    # Its copy: host copies of every layer, the resident window (all layers) and the weights outside the layers.
    checkpoint_bytes = sum(t.numel() * t.element_size() for t in served_checkpoint(tmp_path / "tiny-llama-2l").values())
    assert engine.frozen_bytes() == checkpoint_bytes + engine.stats()["resident_bytes"]
