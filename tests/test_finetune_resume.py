"""State survives pauses between any two units, and a killed job resumes from its last checkpoint."""

import json
import os
import random
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LLAMAFACTORY_VERBOSITY", "WARN")

import pytest
import torch
from conftest import lora_state_dict

from base.errors import HarvestError
from harvest.finetune import FinetuneConfig, FinetuneEngine
from harvest.finetune.decoder_units import GeneratorDropout
from harvest.finetune.demo.tiny_job import write_tiny_job

pytestmark = pytest.mark.usefixtures("one_torch_thread")


MAX_STEPS = 5
SAVE_STEPS = 2


def job(tmp_path, name):
    # lora_dropout > 0 makes the result depend on RNG state, which decode work between units also draws from.
    return write_tiny_job(
        tmp_path,
        num_layers=3,
        max_steps=MAX_STEPS,
        save_steps=SAVE_STEPS,
        lora_dropout=0.1,
        output_dir=str(tmp_path / name),
    )


def run_to_end(engine, between_units=None) -> list[float]:
    losses = []
    while not engine.is_finished:
        if between_units is not None:
            between_units(engine)
        result = engine.run_next_unit()
        if result.is_step_end:
            losses.append(result.loss)
    return losses


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("reference")
    engine = FinetuneEngine.from_yaml(job(tmp_path, "out"))
    return run_to_end(engine), lora_state_dict(engine)


def assert_same_weights(actual, expected):
    assert actual.keys() == expected.keys()
    for key, weight in expected.items():
        torch.testing.assert_close(actual[key], weight, rtol=1e-5, atol=1e-7, msg=key)


def test_pauses_between_arbitrary_units_do_not_change_the_result(tmp_path, reference):
    """Pins that work done between units (sleeps, foreign RNG draws, allocations) leaves no trace."""
    rng = random.Random(0)

    def decode_like_work(engine):
        if rng.random() < 0.3:
            time.sleep(rng.random() * 0.01)
            torch.randn(64, 64) @ torch.randn(64, 64)
            torch.manual_seed(rng.randrange(1000))

    engine = FinetuneEngine.from_yaml(job(tmp_path, "paused"))
    losses = run_to_end(engine, decode_like_work)
    assert losses == pytest.approx(reference[0], rel=1e-6)
    assert_same_weights(lora_state_dict(engine), reference[1])


def test_dropout_draws_from_the_jobs_generator_and_the_device_rng_is_never_swapped(tmp_path, monkeypatch):
    """Pins defect 9: run_next_unit swapped the device's global RNG state in and out around every unit, and in
    spatial mode the unit thread did so while decode sampled from that same generator in the scheduler thread.
    Dropout now draws from the job's generator (on a CPU the global CPU one, swapped per unit with the data
    loader's draws, as before): the device generator is never set and the global CPU state comes back."""
    engine = FinetuneEngine.from_yaml(job(tmp_path, "rng"))
    assert engine.units.uses_dropout
    device_sets = []
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda *a, **k: device_sets.append(a))
    before = torch.get_rng_state()
    kinds = [engine.run_next_unit().kind for _ in range(8)]
    assert "forward" in kinds and "backward" in kinds
    assert device_sets == [] and torch.equal(torch.get_rng_state(), before)
    dropouts = [m for m in engine.units.layers.modules() if isinstance(m, GeneratorDropout)]
    assert dropouts and all(m.generator is engine.generator for m in dropouts)
    assert not any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in engine.units.layers.modules())


@pytest.mark.gpu
def test_cuda_units_never_set_the_device_generator(tmp_path, monkeypatch):
    """The same on a GPU, where it matters: the old code called torch.cuda.set_rng_state twice per unit."""
    engine = FinetuneEngine.from_yaml(job(tmp_path, "rng-cuda"), config=FinetuneConfig(device="cuda"))
    device_sets = []
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda *a, **k: device_sets.append(a))
    before = torch.cuda.get_rng_state()
    for _ in range(8):
        engine.run_next_unit()
    assert device_sets == [] and torch.equal(torch.cuda.get_rng_state(), before)


def test_kill_then_resume_loses_only_the_steps_since_the_last_checkpoint(tmp_path, reference):
    path = job(tmp_path, "killed")
    engine = FinetuneEngine.from_yaml(path)
    while engine.global_step < 3:
        engine.run_next_unit()
    for _ in range(5):  # part of step 4, then the process "dies" without a shutdown checkpoint
        engine.run_next_unit()
    output_dir = engine.llamafactory.output_dir
    del engine
    assert sorted(p.name for p in output_dir.glob("checkpoint-*")) == ["checkpoint-2"]

    resumed = FinetuneEngine.from_yaml(path, config=FinetuneConfig(resume=True))
    assert resumed.global_step == SAVE_STEPS
    losses = run_to_end(resumed)
    assert losses == pytest.approx(reference[0][SAVE_STEPS:], rel=1e-6)
    assert_same_weights(lora_state_dict(resumed), reference[1])
    logged = [json.loads(line) for line in (output_dir / "finetune_log.jsonl").read_text().splitlines()]
    assert [record["step"] for record in logged] == list(range(1, MAX_STEPS + 1))
    assert not (output_dir / f"checkpoint-{MAX_STEPS}").exists()  # the last step is close()'s to save
    resumed.close()
    assert (output_dir / f"checkpoint-{MAX_STEPS}").is_dir()


def test_shutdown_checkpoint_mid_step_resumes_at_that_step(tmp_path, reference):
    path = job(tmp_path, "shutdown")
    engine = FinetuneEngine.from_yaml(path)
    engine.run_step()
    for _ in range(7):
        engine.run_next_unit()
    checkpoint = engine.save_checkpoint()
    assert checkpoint.name == "checkpoint-1"
    assert (checkpoint / "adapter_model.safetensors").is_file() and (checkpoint / "adapter_config.json").is_file()
    resumed = FinetuneEngine.from_yaml(path, config=FinetuneConfig(resume=True))
    assert run_to_end(resumed) == pytest.approx(reference[0][1:], rel=1e-6)
    assert_same_weights(lora_state_dict(resumed), reference[1])


def test_resume_without_a_checkpoint_is_an_error_naming_the_output_dir(tmp_path):
    with pytest.raises(HarvestError, match="no harvest checkpoint in output_dir"):
        FinetuneEngine.from_yaml(job(tmp_path, "empty"), config=FinetuneConfig(resume=True))


def test_fresh_start_over_old_checkpoints_needs_overwrite_output_dir(tmp_path):
    path = job(tmp_path, "reused")
    engine = FinetuneEngine.from_yaml(path, overrides={"max_steps": 2})
    engine.run_step()
    engine.save_checkpoint()
    with pytest.raises(HarvestError, match="output_dir: .* holds checkpoints of an earlier run"):
        FinetuneEngine.from_yaml(path, overrides={"overwrite_output_dir": False})
    fresh = FinetuneEngine.from_yaml(path)  # the job says overwrite_output_dir: true
    assert fresh.global_step == 0 and not list(fresh.llamafactory.output_dir.glob("checkpoint-*"))
