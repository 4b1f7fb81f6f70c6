"""What `harvest profile` shares between CPU core sets and a GPU's SM partitions (profiled_device.py), on this
host's real core partitions: the grids it samples, the points a pinned worker can be measured on, the job
timed alone per finetune partition, and the co-run rates read back from the worker. The GPU's form of the same
checks runs on a fake driver in test_green_partitions_driver.py and on a real GPU in test_green_partitions.py."""

import os
import threading

import pytest

from base.errors import HarvestError
from harvest.profiler.live_profile import co_run_rates_by_ft
from harvest.profiler.profiled_device import cpu_device
from predictor.partition_grid import PartitionGrid
from predictor.sampling_plan import SamplingPlan

CORES = sorted(os.sched_getaffinity(0))
needs_two_cores = pytest.mark.skipif(len(CORES) < 2, reason="core partitions need two cores")


@needs_two_cores
def test_a_cpu_hosts_grids_and_every_planned_point_are_its_core_partitions():
    device = cpu_device(CORES[:2])
    assert device.finetune_device == "cpu" and device.name.startswith("CPU")
    assert device.grid(co_run=True) == PartitionGrid(2, 1)
    assert device.grid(co_run=False) == PartitionGrid(1, 1)      # a solo CPU profile: the host is one unit
    assert sorted(device.partitions.pairs) == [(1, 0), (1, 1), (2, 0)]
    device.check_co_run()
    plan = SamplingPlan(device.grid(co_run=True), 3, 64, num_seq_levels=2, num_held_out_per_partition=1)
    kept, dropped = device.measurable(plan.points(), co_run=True)
    assert kept == plan.points() and dropped == []
    assert {(p.infer_sms, p.ft_sms) for p in kept} == {(1, 0), (2, 0), (1, 1)}


def test_one_core_cannot_co_run():
    with pytest.raises(HarvestError, match=r"--co-run needs at least two partitions.*1 core"):
        cpu_device(CORES[:1]).check_co_run()


@needs_two_cores
def test_the_finetune_context_pins_the_calling_thread_to_the_last_cores():
    import torch

    device = cpu_device(CORES[:2])
    seen = {}

    def run():
        with device.finetune_context(1):
            seen["cores"] = os.sched_getaffinity(threading.get_native_id())
            seen["threads"] = torch.get_num_threads()
        seen["after"] = os.sched_getaffinity(threading.get_native_id())

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen["cores"] == {CORES[1]} and seen["threads"] == 1
    assert seen["after"] == set(CORES)
    with pytest.raises(HarvestError, match="no partition of this device gives the finetune job 2"):
        device.finetune_context(2)


def test_co_run_rates_pool_partitions_with_the_same_finetune_side():
    stats = {"64,56": {"tokens": 300, "ms_granted": 1000.0}, "32,56": {"tokens": 100, "ms_granted": 1000.0},
             "64,8": {"tokens": 50, "ms_granted": 500.0}, "16,8": {"tokens": 0, "ms_granted": 400.0},
             "8,120": {"tokens": 0, "ms_granted": 0.0}}
    assert co_run_rates_by_ft(stats) == {8: 100.0, 56: 200.0}


@needs_two_cores
def test_the_job_alone_is_timed_per_finetune_partition_on_one_engine(tmp_path):
    """The real tiny job: one engine, warmed on the whole device, then timed on each finetune partition in a
    thread of its own (its OpenMP team made on the partition's cores) and on the whole device."""
    import contextlib

    from harvest.finetune.demo.tiny_job import write_tiny_job
    from harvest.profiler.finetune_profiler import FinetuneProfiler

    device = cpu_device(CORES[:2])
    job = write_tiny_job(tmp_path / "job", num_layers=2)
    seen = {}

    def recording(ft, context):
        @contextlib.contextmanager
        def factory():
            with context():
                seen[ft] = os.sched_getaffinity(threading.get_native_id())
                yield
        return factory

    measured = FinetuneProfiler(job, num_steps=1, max_unit_ms=20.0, device=device.finetune_device).measure_partitions(
        {1: recording(1, lambda: device.finetune_context(1)), 2: recording(2, contextlib.nullcontext)})
    assert seen == {1: {CORES[1]}, 2: set(CORES)}
    assert sorted(measured) == [1, 2]
    for ft, m in measured.items():
        assert m.num_steps == 1 and m.num_units > 1 and m.num_tokens > 0
        assert m.throughput.ft_sms == ft and m.throughput.tokens_per_s_solo > 0 and m.throughput.unit_ms > 0
        assert m.throughput.tokens_per_s_colo is None and m.throughput.samples_per_s_solo > 0
    assert measured[1].num_samples == measured[2].num_samples    # one step each of the same job


@needs_two_cores
def test_a_pinned_cpu_worker_without_a_profile_forms_every_core_partition():
    """The profiler pins its worker to any planned partition through the admin API: without a profile the
    worker forms them all (as a GPU worker must, to have their green contexts and decode graphs)."""
    from harvest.config import AdminConfig, ServeConfig
    from harvest.finetune import FinetuneConfig
    from harvest.runtime import _spatial_partitions

    config = ServeConfig(admin=AdminConfig(), finetune=FinetuneConfig("cpu", yaml_path="job.yaml"),
                         tpot_slo_ms=1.0, pinned_partition=(len(CORES), 0))
    partitions = _spatial_partitions(config, None, 0)
    grid = PartitionGrid(len(CORES), 1)
    assert sorted(partitions.pairs) == sorted([(i, 0) for i in grid.infer_options()] + list(grid.pairs()))
