"""Compiled decoder layers (harvest.finetune.compiled_layers): the graphs made while the engine is built serve
every slice a job runs (several rows and one), on a thread other than the builder, at each thread count they were
made for, with losses equal to the eager engine's within float rounding; a unit no graph admits runs eagerly,
counted, instead of tracing on a thread that runs units."""

import os
import threading

import pytest
import torch

from harvest.finetune import FinetuneConfig, FinetuneEngine
from harvest.finetune.compiled_layers import COMPILE_NICE, CompiledLayers
from harvest.finetune.demo.tiny_job import write_tiny_job

# The module's engine compiles its graphs for two thread counts at nice 19 (COMPILE_NICE): from a fresh clone's
# cold inductor cache that is over the default 120 s bound, more beside the other test process.
pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.timeout(600)]

# Batches of 3 rows in slices of at most 2: every micro-batch runs a slice of two rows and one of one.
JOB = {"per_device_train_batch_size": 3, "gradient_accumulation_steps": 1, "max_steps": 100, "save_steps": 1000}
THREAD_COUNTS = (1, 2)
STEPS_PER_COUNT = 2


def _engine(work, **config) -> FinetuneEngine:
    job = write_tiny_job(work, output_dir=str(work / "out"), **JOB)
    return FinetuneEngine.from_yaml(job, config=FinetuneConfig(max_slice_rows=2, **config))


def _losses_on_a_unit_thread(engine: FinetuneEngine, num_threads: int, num_steps: int) -> list[float]:
    """Steps on a thread that did not build the engine, as the worker's unit and scheduler threads are."""
    losses = []

    def run():
        before = torch.get_num_threads()  # a thread's count is also the one later threads start with
        torch.set_num_threads(num_threads)
        try:
            losses.extend(engine.run_step().loss for _ in range(num_steps))
        finally:
            torch.set_num_threads(before)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert len(losses) == num_steps
    return losses


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    return _engine(tmp_path_factory.mktemp("compiled"), compile_layers=True, compile_thread_counts=THREAD_COUNTS)


def test_compiled_steps_equal_eager_ones_within_rounding_and_trace_nothing_after_the_build(compiled, tmp_path):
    eager = _engine(tmp_path)
    assert eager.units.compiled is None and eager.stats()["compiled_layers"] is None
    layers = compiled.units.compiled
    calls, eager_calls = layers.num_calls, layers.num_eager_calls
    for count in THREAD_COUNTS:
        expected = _losses_on_a_unit_thread(eager, count, STEPS_PER_COUNT)
        assert _losses_on_a_unit_thread(compiled, count, STEPS_PER_COUNT) == pytest.approx(expected, rel=1e-5)
    # Every layer call of those steps ran a graph made at the build.
    assert layers.num_calls > calls and layers.num_eager_calls == eager_calls
    stats = compiled.stats()
    assert stats["compiled_layers"]["thread_counts"] == list(THREAD_COUNTS)
    assert stats["warmup_unit_ms"]["compile"] > 0


def test_graphs_take_a_layers_floats_as_constants_so_no_guard_builds_a_tensor_at_a_call(compiled):
    """Under dynamic=True dynamo makes a module's float attributes (norm epsilon, LoRA scaling) graph inputs,
    each checked at every call by a Python guard that builds a tensor (`___as_tensor(...).item()`): held
    interpreter time, beside SGLang's scheduler thread, on every unit."""
    from harvest.finetune import compiled_layers

    # Dynamo's own view of the graphs cached for the compiled function's code (no public API lists them).
    entries = torch._dynamo.eval_frame._debug_get_cache_entry_list(compiled_layers._call_layer.__code__)
    assert entries
    guards = [str(entry.guard_manager) for entry in entries]
    assert all("TENSOR_MATCH" in text for text in guards)  # the listing is the guards' (it names the tensors')
    assert not any("___as_tensor" in text for text in guards)


def test_a_thread_count_without_graphs_runs_its_units_eagerly_and_counts_them(compiled):
    layers = compiled.units.compiled
    calls, eager_calls = layers.num_calls, layers.num_eager_calls
    (loss,) = _losses_on_a_unit_thread(compiled, max(THREAD_COUNTS) + 1, 1)
    assert layers.num_eager_calls - eager_calls == layers.num_calls - calls > 0
    assert torch.isfinite(torch.tensor(loss))


def test_a_unit_while_another_jobs_warm_up_compiles_runs_eagerly(compiled):
    """A warm-up needs dynamo's default stance: a unit that would set its own meanwhile runs eagerly instead."""
    from harvest.finetune import compiled_layers

    layers = compiled.units.compiled
    calls, eager_calls = layers.num_calls, layers.num_eager_calls
    with compiled_layers._STANCE:  # as another job's warm-up holds it
        _losses_on_a_unit_thread(compiled, min(THREAD_COUNTS), 1)
    assert layers.num_eager_calls - eager_calls == layers.num_calls - calls > 0
    calls, eager_calls = layers.num_calls, layers.num_eager_calls
    _losses_on_a_unit_thread(compiled, min(THREAD_COUNTS), 1)
    assert layers.num_calls > calls and layers.num_eager_calls == eager_calls


def test_graphs_are_made_on_a_thread_of_its_own_at_the_lowest_priority_one_thread_count_at_a_time():
    seen = []
    layers = CompiledLayers((2, 1, 2))

    def run_units():
        tid = threading.get_native_id()
        seen.append((threading.current_thread().name, os.getpriority(os.PRIO_PROCESS, tid), torch.get_num_threads()))

    def new_threads_count() -> int:
        counts = []
        thread = threading.Thread(target=lambda: counts.append(torch.get_num_threads()))
        thread.start()
        thread.join()
        return counts[0]

    before = new_threads_count()
    layers.warm_up(run_units)
    assert seen == [("harvest-finetune-compile", COMPILE_NICE, 1), ("harvest-finetune-compile", COMPILE_NICE, 2)]
    # The compile thread's counts do not become the count threads started later begin with.
    assert new_threads_count() == before

    def fails():
        raise RuntimeError("no graph")

    with pytest.raises(RuntimeError, match="no graph"):
        layers.warm_up(fails)


def test_a_job_whose_layers_do_not_compile_trains_eagerly_and_says_why(tmp_path, monkeypatch):
    def graph_break(*args, **kwargs):
        raise RuntimeError("dynamo: unsupported")

    monkeypatch.setattr(CompiledLayers, "warm_up", graph_break)
    engine = _engine(tmp_path, compile_layers=True)
    assert engine.units.compiled is None
    assert engine.stats()["compiled_layers"] == {"eager": "compiling them failed: RuntimeError: dynamo: unsupported"}
    assert torch.isfinite(torch.tensor(engine.run_step().loss))


@pytest.mark.parametrize("flags, compiles", [((), True), (("--no-finetune-compile",), False)])
def test_harvest_serve_compiles_its_jobs_layers_unless_told_not_to(tmp_path, flags, compiles):
    from harvest.cli.main import build_parser
    from harvest.cli.serve import _finetune_config

    job = write_tiny_job(tmp_path)
    argv = ["serve", "--model-path", str(job.parent), "--finetune", str(job), "--tpot-slo-ms", "100", *flags]
    args = build_parser(argv).parse_args(argv)
    config, _ = _finetune_config(args, job.parent)
    assert config.compile_layers is compiles
