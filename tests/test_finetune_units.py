"""The unit stream a scheduler sees: order, results, and time-based splitting of micro-batches."""

import contextlib
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LLAMAFACTORY_VERBOSITY", "WARN")

import pytest
import torch
import yaml
from conftest import lora_state_dict

from harvest.colocation.finetune_job import FinetuneJob
from harvest.finetune import FinetuneConfig, FinetuneEngine
from harvest.finetune.demo.tiny_job import write_tiny_job
from harvest.finetune.unit_sizer import UnitSizer

NUM_LAYERS = 3


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def job_path(tmp_path_factory):
    return write_tiny_job(
        tmp_path_factory.mktemp("units"), num_layers=NUM_LAYERS, max_steps=3, gradient_accumulation_steps=1
    )


def test_one_step_is_embed_forwards_head_backwards_optimizer(job_path):
    engine = FinetuneEngine.from_yaml(job_path)
    assert engine.has_ready_work() and engine.stats()["state"] == "running"
    results = []
    while not results or not results[-1].is_step_end:
        results.append(engine.run_next_unit())
    expected = (
        [("embed", None)]
        + [("forward", i) for i in range(NUM_LAYERS)]
        + [("head", None)]
        + [("backward", i) for i in reversed(range(NUM_LAYERS))]
        + [("optimizer", None)]
    )
    assert [(r.kind, r.layer_id) for r in results] == expected
    assert all(r.duration_ms > 0 for r in results)
    assert all(r.num_tokens > 0 for r in results[:-1]) and results[-1].num_tokens == 0
    assert [r.loss is not None for r in results] == [False] * (len(results) - 1) + [True]
    assert results[-1].step == engine.stats()["step"] == 1
    assert engine.stats()["loss"] == results[-1].loss > 0


def test_a_tight_unit_budget_splits_micro_batches_without_changing_the_result(job_path, monkeypatch):
    reference = FinetuneEngine.from_yaml(job_path)
    while not reference.is_finished:
        reference.run_step()
    # The sizer sees 1 ms per token whatever the clock says: how far the head is cut follows its fitted fixed
    # cost (unit_sizer.py), which on a loaded host's timings kept whole rows; this test is about the result.
    observe = UnitSizer.observe
    monkeypatch.setattr(UnitSizer, "observe", lambda self, kind, num_tokens, duration_ms:
                        observe(self, kind, num_tokens, float(num_tokens)))
    split = FinetuneEngine.from_yaml(job_path, config=FinetuneConfig(max_unit_ms=1e-6))
    slice_ids, heads_per_step, kinds = set(), [0], []
    while not split.is_finished:
        result = split.run_next_unit()
        if result.slice_id is not None and result.kind == "embed":
            assert split.stats()["slice_rows"] == [1] * len(split.stats()["slice_rows"])  # what the stats say
        slice_ids.add(result.slice_id)
        heads_per_step[-1] += result.kind == "head"
        kinds.append(result.kind)
        if result.is_step_end:
            heads_per_step.append(0)
    batch_size = split.llamafactory.training_args.per_device_train_batch_size
    assert slice_ids == set(range(batch_size))  # every row is its own unit (from the first step: nothing timed)
    # ... and once a head is timed, every row's head is cut into one unit per position (the loss is a sum over
    # positions)
    assert heads_per_step[0] == batch_size and all(n > 2 * batch_size for n in heads_per_step[1:-1])
    assert kinds.count("recompute") == kinds.count("backward") > 0  # a bounded layer backward is two units
    # ... and each optimizer update is a grad_norm unit and one part per layer's worth of parameters
    num_steps = split.global_step
    assert kinds.count("grad_norm") == num_steps and kinds.count("optimizer") == NUM_LAYERS * num_steps
    expected = lora_state_dict(reference)
    for key, weight in lora_state_dict(split).items():
        torch.testing.assert_close(weight, expected[key], rtol=1e-5, atol=1e-7)


def test_a_bound_asked_for_mid_step_sizes_the_next_step_and_leaves_the_result_alone(job_path, tmp_path,
                                                                                     monkeypatch):
    """A co-run controller asks the job for another unit bound while the unit thread owns it
    (FinetuneJob.request_unit_bound): the step in progress keeps the slices it was planned with, the next one is
    cut to the new bound, and the adapter is the one an unchanged bound trains."""
    observe = UnitSizer.observe  # 1 ms per position whatever the clock says, as above
    monkeypatch.setattr(UnitSizer, "observe", lambda self, kind, num_tokens, duration_ms:
                        observe(self, kind, num_tokens, float(num_tokens)))
    reference = FinetuneEngine.from_yaml(job_path, {"output_dir": str(tmp_path / "reference")},
                                         config=FinetuneConfig(max_unit_ms=1e-6))
    reference.run_step()
    reference.run_step()
    job = FinetuneJob(FinetuneConfig(yaml_path=str(job_path), max_unit_ms=1e-6),
                      engine_factory=lambda config: FinetuneEngine.from_yaml(
                          job_path, {"output_dir": str(tmp_path / "job")}, config=config))
    job.start()
    assert job.wait_built(timeout_s=120) and job.state.value == "running", job.error
    batch_size = job.engine.llamafactory.training_args.per_device_train_batch_size
    first = [job.run_unit() for _ in range(3)]  # into the first step, planned one row per slice
    job.request_unit_bound(1e9)
    assert job.max_unit_ms == 1e9 and job.engine.max_unit_ms == 1e-6, "applied by the owner, at its next unit"
    while not first[-1].is_step_end:
        first.append(job.run_unit())
    assert job.engine.max_unit_ms == 1e9
    assert {r.slice_id for r in first} == set(range(batch_size)), "the step in progress kept its slices"
    second = [job.run_unit()]
    while not second[-1].is_step_end:
        second.append(job.run_unit())
    assert {r.slice_id for r in second} == {0}, "the next step was cut to the new bound: one slice of all rows"
    assert [r.kind for r in second].count("head") == 1
    job.request_unit_bound(None)
    assert job.max_unit_ms == 1e-6, "None goes back to the job's own bound"
    expected = lora_state_dict(reference)
    for key, weight in lora_state_dict(job.engine).items():
        torch.testing.assert_close(weight, expected[key], rtol=1e-5, atol=1e-7)


def test_a_checkpoint_in_the_middle_of_an_optimizer_update_finishes_the_update_first(tmp_path):
    """Between two parts of an update the adapter is neither step's: a stop there (the worker's checkpoint)
    runs the parts left, so the checkpoint holds the step's whole update, as a run with no stop."""
    job_path = write_tiny_job(tmp_path, num_layers=NUM_LAYERS, max_steps=3, save_steps=1000)
    config = FinetuneConfig(max_unit_ms=1e-6)
    reference = FinetuneEngine.from_yaml(job_path, config=config)
    reference.run_step()
    expected = lora_state_dict(reference)
    engine = FinetuneEngine.from_yaml(job_path, {"output_dir": str(tmp_path / "stopped")}, config=config)
    while not engine.is_mid_update:
        assert not engine.run_next_unit().is_step_end
    assert engine.global_step == 0
    checkpoint = engine.save_checkpoint()
    assert checkpoint.name == "checkpoint-1" and engine.global_step == 1 and not engine.is_mid_update
    resumed = FinetuneEngine.from_yaml(job_path, {"output_dir": str(tmp_path / "stopped")},
                                       config=FinetuneConfig(resume=True))
    assert resumed.global_step == 1
    for weights in (lora_state_dict(engine), lora_state_dict(resumed)):
        assert weights.keys() == expected.keys()
        assert all(torch.equal(weights[k], expected[k]) for k in expected)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_layer_evicted_between_its_recompute_and_backward_units_is_recomputed_again(job_path, device):
    """The recompute unit's graph holds the layer's resident weights; evicting the layer (its memory lent back
    to decode) before the backward unit moves them, so the backward unit recomputes on the refetched ones.
    On a GPU recompute units run on another stream than backward units, as a spatial worker runs them (the
    finetune partition's stream, then the whole device's in a slice)."""
    reference = FinetuneEngine.from_yaml(job_path, config=FinetuneConfig(device=device))
    reference.run_step()
    engine = FinetuneEngine.from_yaml(job_path, config=FinetuneConfig(device=device, max_unit_ms=1e3))
    side = torch.cuda.Stream() if device == "cuda" else None
    kinds, is_step_end = [], False
    while not is_step_end:
        if kinds[-1:] == ["recompute"] and "backward" not in kinds:
            engine.set_window(0)
            engine.set_window(NUM_LAYERS)
        on_side = side is not None and engine.next_unit_kind() == "recompute"
        with torch.cuda.stream(side) if on_side else contextlib.nullcontext():
            result = engine.run_next_unit()
        kinds.append(result.kind)
        is_step_end = result.is_step_end
    assert kinds.count("recompute") == kinds.count("backward") > NUM_LAYERS
    assert engine.stats()["recomputed_again"] == 1
    expected = lora_state_dict(reference)
    for key, weight in lora_state_dict(engine).items():
        torch.testing.assert_close(weight, expected[key], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("spans", [[None], [(0, 5), (5, None)]])
def test_a_head_over_vocabulary_chunks_gives_the_whole_heads_loss_and_gradient(job_path, spans, device):
    """head_part over K chunks (K for the logits and log-sum-exp, K for the gradient) against head on the
    same row slice: the same loss and the same gradient at the last layer's output."""
    engine = FinetuneEngine.from_yaml(job_path, config=FinetuneConfig(device=device))
    while engine._queue.peek() is None or engine._queue.peek().kind != "head":
        engine.run_next_unit()
    units, unit = engine.units, engine._queue.peek()
    row_slice = engine._queue.slices[unit.slice_id]
    seq_len = row_slice.hidden[NUM_LAYERS].shape[1]
    spans = [None if span is None else (span[0], span[1] or seq_len) for span in spans]
    head_input = row_slice.hidden[NUM_LAYERS].clone()
    whole_loss = sum(units.head(row_slice, span) for span in spans)
    whole_grad = row_slice.grad.clone()
    assert units.max_head_vocab_parts == 4  # the tiny model's 512-word vocabulary in chunks of >= 128
    for num_parts in (1, 3, 4):
        row_slice.hidden[NUM_LAYERS], row_slice.grad = head_input.clone(), None
        loss = sum(units.head_part(row_slice, span, (j, num_parts)) for span in spans for j in range(2 * num_parts))
        torch.testing.assert_close(loss, whole_loss, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(row_slice.loss, whole_loss, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(row_slice.grad, whole_grad, rtol=1e-5, atol=1e-7)
        assert row_slice.hidden[NUM_LAYERS] is None and row_slice.head_parts is None


def test_finished_engine_refuses_more_units(job_path):
    engine = FinetuneEngine.from_yaml(job_path, overrides={"max_steps": 1})
    engine.run_step()
    assert engine.is_finished and not engine.has_ready_work() and engine.stats()["state"] == "finished"
    with pytest.raises(RuntimeError, match="finished"):
        engine.run_next_unit()


def test_the_colocation_job_closes_a_finished_engine_once(job_path, monkeypatch):
    """Pins that the final checkpoint and adapter are written once: the engine used to close itself at its
    last step and FinetuneJob closed it again. Forced by counting close calls over a job run to the end."""
    from harvest.colocation.finetune_job import FinetuneJob
    from harvest.finetune import FinetuneConfig

    closed_at_steps = []
    close = FinetuneEngine.close
    monkeypatch.setattr(FinetuneEngine, "close", lambda self: closed_at_steps.append(self.global_step) or close(self))
    job = FinetuneJob(FinetuneConfig(yaml_path=str(job_path)))
    job.start()
    assert job.wait_built(timeout_s=120) and job.state.value == "running", job.error
    output_dir = job.engine.llamafactory.output_dir
    while job.has_ready_work():
        job.run_unit()
    assert job.state.value == "finished", job.error
    assert closed_at_steps == [3]
    assert (output_dir / "adapter_model.safetensors").is_file()
    assert job.engine is None, "a finished job releases its engine (and the memory its window held)"
    # Pins the token count the live replay and /metrics report: each sample's tokens once per step, not once
    # per unit (it was ~2 x num_layers + 2 times too high).
    log = [json.loads(line) for line in (output_dir / "finetune_log.jsonl").read_text().splitlines()]
    assert job.stats()["tokens"] == sum(record["num_tokens"] for record in log) > 0
    # Samples: the optimizer steps it made times the samples one step trains (rows x accumulation).
    args = yaml.safe_load(Path(job_path).read_text())
    assert job.stats()["samples"] == 3 * args["per_device_train_batch_size"] * args.get("gradient_accumulation_steps", 1)


def test_a_step_that_writes_a_checkpoint_is_its_own_unit_kind_announced_before_it_runs(tmp_path):
    """The slice admits a unit by its kind's recent times: the optimizer step that ends with a checkpoint
    write is announced and timed as "checkpoint" (write included), so the write's time is never taken for an
    optimizer step's and never missing from the unit's time."""
    engine = FinetuneEngine.from_yaml(write_tiny_job(tmp_path, save_steps=2, max_steps=100))
    kinds = []
    while engine.global_step < 4:
        announced = engine.next_unit_kind()
        result = engine.run_next_unit()
        assert result.kind == announced
        kinds.append(result.kind)
    assert [k for k in kinds if k in ("optimizer", "checkpoint")] == ["optimizer", "checkpoint"] * 2
    assert len(list(Path(engine.llamafactory.output_dir).glob("checkpoint-*"))) == 2


def test_the_sizer_times_a_unit_by_the_positions_it_computes_padding_included(job_path, monkeypatch):
    """Attention, the MLP and the head compute over padded positions as over real ones: a unit's size is rows x
    positions. Fed non-padding tokens, a head span of padding alone was never timed at all."""
    observed = []
    observe = UnitSizer.observe
    monkeypatch.setattr(UnitSizer, "observe", lambda self, kind, num_positions, duration_ms:
                        observed.append((kind, num_positions)) or observe(self, kind, num_positions, duration_ms))
    engine = FinetuneEngine.from_yaml(job_path)
    results = []
    while not results or not results[-1].is_step_end:
        results.append(engine.run_next_unit())
    assert [kind for kind, _ in observed] == [r.kind for r in results]
    layer_units = [(r, n) for r, (kind, n) in zip(results, observed, strict=True) if kind in ("forward", "backward")]
    assert all(n >= r.num_tokens > 0 for r, n in layer_units)
    assert any(n > r.num_tokens for r, n in layer_units)  # these batches are padded
    for slice_id in {r.slice_id for r, _ in layer_units}:  # every layer unit of a row slice is the same size
        assert len({n for r, n in layer_units if r.slice_id == slice_id}) == 1


def test_the_engine_predicts_its_next_unit_on_its_kinds_line_at_the_size_it_was_cut_to(job_path, monkeypatch):
    """A slice admits a unit at what the sizer's line says its size takes (UnitTimes.estimate_ms): the engine
    predicts the unit it runs next at the positions that unit computes, an optimizer part at its share of the
    update, and nothing for a new step (not cut yet) or an unsized kind. A clock that gives every unit 0.5 ms
    plus 1 ms per position makes the line exact."""
    observe = UnitSizer.observe
    monkeypatch.setattr(UnitSizer, "observe", lambda self, kind, num_positions, duration_ms:
                        observe(self, kind, num_positions, 0.5 + float(num_positions)))
    engine = FinetuneEngine.from_yaml(job_path, config=FinetuneConfig(max_unit_ms=40.0))
    assert engine.next_unit_predicted_ms() is None
    predicted_kinds = set()
    while not engine.is_finished:
        unit = engine._queue.peek()
        predicted = engine.next_unit_predicted_ms()
        update_ms = engine._sizer._optimizer_ms
        engine.run_next_unit()
        if unit is None or unit.kind == "grad_norm":
            assert predicted is None
        elif unit.param_part is not None:
            assert predicted == (None if update_ms is None else pytest.approx(update_ms / unit.param_part[1]))
        elif unit.vocab_part is None and predicted is not None:
            predicted_kinds.add(unit.kind)
            assert predicted == pytest.approx(0.5 + engine._queue.num_unit_positions(unit))
    assert {"forward", "head", "backward"} <= predicted_kinds
