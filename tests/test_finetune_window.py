"""Window-based swapping: results do not depend on the window, and evicted layers really hold no storage."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LLAMAFACTORY_VERBOSITY", "WARN")

import pytest
import torch
from conftest import lora_state_dict

from harvest.finetune import FinetuneConfig, FinetuneEngine
from harvest.finetune.demo.tiny_job import write_tiny_job

pytestmark = pytest.mark.usefixtures("one_torch_thread")


NUM_LAYERS = 4
GPU_RTOL, GPU_ATOL = 1e-4, 1e-6   # GPU runs of the same job may differ by kernel choice, not by the window


@pytest.fixture(scope="module")
def job_path(tmp_path_factory):
    return write_tiny_job(tmp_path_factory.mktemp("window"), num_layers=NUM_LAYERS, max_steps=3)


def train(job_path, config: FinetuneConfig, on_unit=None) -> tuple[list[float], dict]:
    engine = FinetuneEngine.from_yaml(job_path, config=config)
    losses = []
    while not engine.is_finished:
        result = engine.run_next_unit()
        if on_unit is not None:
            on_unit(engine, result)
        if result.is_step_end:
            losses.append(result.loss)
    return losses, lora_state_dict(engine)


def frozen_layer_numels(engine) -> list[int]:
    return [sum(p.numel() for p in layer.parameters() if not p.requires_grad) for layer in engine.units.layers]


@pytest.fixture(scope="module")
def no_swapping(job_path):
    return train(job_path, FinetuneConfig())


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_windows_of_one_two_and_all_layers_train_identically(job_path, no_swapping, device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    reference_losses, reference_weights = no_swapping if device == "cpu" else train(job_path, FinetuneConfig(device))
    for window in (1, 2, NUM_LAYERS):
        seen_resident = []

        def check(engine, result, window=window, seen_resident=seen_resident):
            resident = frozen_layer_numels(engine)
            seen_resident.append(sum(1 for n in resident if n > 0))
            assert engine.stats()["resident_bytes"] <= engine.window_bytes(window)

        losses, weights = train(job_path, FinetuneConfig(device=device, num_window_layers=window), check)
        if device == "cpu":
            assert losses == reference_losses
            for key, weight in reference_weights.items():
                assert torch.equal(weights[key], weight), key
        else:
            # cuBLAS may pick other kernels (split-K, atomics) between runs: equal within float rounding
            # of a few steps, not bit for bit. The window must not change the math beyond that.
            assert losses == pytest.approx(reference_losses, rel=GPU_RTOL)
            for key, weight in reference_weights.items():
                torch.testing.assert_close(weights[key], weight, rtol=GPU_RTOL, atol=GPU_ATOL, msg=key)
        assert max(seen_resident) == window


def test_shrinking_the_window_mid_step_frees_evicted_layers_at_once(job_path):
    engine = FinetuneEngine.from_yaml(job_path, config=FinetuneConfig())
    layer_bytes = engine.window_bytes(1)
    assert engine.window_bytes(NUM_LAYERS) == NUM_LAYERS * layer_bytes > 0
    while engine.run_next_unit().kind != "head":
        pass
    assert engine.stats()["resident_bytes"] == NUM_LAYERS * layer_bytes
    engine.set_window(1)
    # The next unit is the backward of the last layer: it is the one layer kept.
    assert frozen_layer_numels(engine).count(0) == NUM_LAYERS - 1
    assert frozen_layer_numels(engine)[NUM_LAYERS - 1] > 0
    assert engine.stats()["resident_bytes"] == layer_bytes
    assert engine.has_ready_work()
    engine.set_window(3)
    assert engine.stats()["resident_bytes"] == 3 * layer_bytes
    with pytest.raises(ValueError, match="num_layers"):
        engine.set_window(NUM_LAYERS + 1)


def test_window_changes_between_units_do_not_change_the_result(job_path, no_swapping):
    """Pins that resizing W at arbitrary unit boundaries (as the allocator will) leaves training unchanged."""
    reference_losses, reference_weights = no_swapping
    schedule = iter([1, 3, 2, 4, 1, 1, 2] * 100)
    losses, weights = train(job_path, FinetuneConfig(num_window_layers=2), lambda e, r: e.set_window(next(schedule)))
    assert losses == reference_losses
    for key, weight in reference_weights.items():
        assert torch.equal(weights[key], weight), key


@pytest.mark.gpu
def test_cuda_shrink_returns_device_memory(job_path):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    engine = FinetuneEngine.from_yaml(job_path, config=FinetuneConfig(device="cuda"))
    while engine.run_next_unit().kind != "head":
        pass
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    engine.set_window(1)
    torch.cuda.synchronize()
    freed = before - torch.cuda.memory_allocated()
    assert freed >= (NUM_LAYERS - 1) * engine.window_bytes(1)
    engine.run_step()  # the remaining backward units still run, fetching layers back one at a time
    assert engine.global_step == 1
