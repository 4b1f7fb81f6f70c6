"""The engine's warm-up: every unit kind runs once while the engine is built, and training is bit for bit what
it is without it."""

import os
import random

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LLAMAFACTORY_VERBOSITY", "WARN")

import numpy as np
import pytest
import torch
from conftest import lora_state_dict

from harvest.finetune import FinetuneConfig, FinetuneEngine
from harvest.finetune.demo.tiny_job import write_tiny_job

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def train(job_path, warm_up: bool) -> tuple[FinetuneEngine, list[float]]:
    # One-row units and a window of one layer: the warm-up borrows a layer the window does not hold.
    engine = FinetuneEngine.from_yaml(job_path, config=FinetuneConfig(
        warm_up_units=warm_up, num_window_layers=1, max_slice_rows=1))
    losses = []
    while not engine.is_finished:
        losses.append(engine.run_step().loss)
    return engine, losses


def test_training_is_bit_for_bit_the_same_with_and_without_the_warm_up(tmp_path):
    """Pins that the warm-up leaves no trace in training: LoRA dropout (its masks from the job's generator),
    clipping (the grad_norm unit) and accumulation make the losses, the adapter and the optimizer state depend
    on the RNG streams, the gradients and the optimizer state it must not touch."""
    job_path = write_tiny_job(tmp_path, num_layers=3, max_steps=4, lora_dropout=0.1, max_grad_norm=0.05,
                              output_dir=str(tmp_path / "out"))
    cold, cold_losses = train(job_path, warm_up=False)
    warm, warm_losses = train(job_path, warm_up=True)
    assert cold.warmup_ms is None and cold.stats()["warmup_ms"] is None
    assert warm.stats()["warmup_ms"] > 0
    assert {"embed", "forward", "head", "recompute", "backward", "grad_norm", "optimizer"} <= set(
        warm.stats()["warmup_unit_ms"])
    assert len(warm_losses) == 4 and warm_losses == cold_losses
    cold_adapter, warm_adapter = lora_state_dict(cold), lora_state_dict(warm)
    assert cold_adapter.keys() == warm_adapter.keys()
    assert all(torch.equal(warm_adapter[k], cold_adapter[k]) for k in cold_adapter)
    cold_state, warm_state = cold.optimizer.state_dict()["state"], warm.optimizer.state_dict()["state"]
    assert cold_state.keys() == warm_state.keys()
    for index, state in cold_state.items():
        assert all(torch.equal(warm_state[index][k], v) for k, v in state.items()), index
    assert warm.global_step == cold.global_step and warm.lr_scheduler.get_last_lr() == cold.lr_scheduler.get_last_lr()


def test_the_warm_up_draws_from_no_shared_generator_and_leaves_no_gradient_nor_resident_layer(tmp_path):
    """While the engine is built a worker decodes: the warm-up must not draw from torch's, python's or numpy's
    global generators, which decode's sampling shares (on a CPU torch's is the job's dropout generator too); the
    gradients it computes are dropped and the layer it borrowed goes back to its placeholders."""
    from harvest.finetune.unit_warmup import warm_up_units

    job_path = write_tiny_job(tmp_path, num_layers=2, max_steps=1, lora_dropout=0.1)
    engine = FinetuneEngine.from_yaml(job_path, config=FinetuneConfig(warm_up_units=False, num_window_layers=1))
    assert engine.units.uses_dropout and engine.units.max_head_vocab_parts >= 2
    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    states = torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    times = warm_up_units(engine.units, engine._swapper, engine._optimizer, engine.setup.dataloader.collate_fn,
                          can_split_head=True)
    assert set(times) == {"embed", "forward", "head", "recompute", "backward", "grad_norm", "optimizer"}
    assert torch.equal(torch.get_rng_state(), states[0]) and random.getstate() == states[1]
    assert np.array_equal(np.random.get_state()[1], states[2])
    assert all(p.grad is None for p in engine.peft_model.parameters())
    assert engine.units.generator is engine.generator
    assert engine.num_resident_layers == 0
    frozen = [p for p in engine.units.layers[-1].parameters() if not p.requires_grad]
    assert frozen and all(p.numel() == 0 for p in frozen)
    assert not any(engine.optimizer.state.values())
