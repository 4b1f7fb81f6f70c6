"""Spatial co-location on CPU cores with real threads (no worker): decode runs in the scheduler thread on
the inference cores while units run in the unit thread on the finetune cores, across steps (the hand-off
rules themselves: test_spatial_ownership.py)."""

import dataclasses
import os
import threading
import time

import pytest
import torch
from conftest import AlwaysReadyJob

from base.errors import HarvestError
from harvest.colocation.core_partitions import CorePartitions
from harvest.colocation.spatial_controller import SpatialController
from harvest.profiler.live_profile import co_run_rates_by_ft
from harvest.replay.simulated_job import SimulatedUnit
from harvest.step_stats import DecodeStep, SloTracker

CORES = sorted(os.sched_getaffinity(0))
needs_two_cores = pytest.mark.skipif(len(CORES) < 2, reason="core partitions need two cores")
UNIT_MS = 3.0


class RecordingJob(AlwaysReadyJob):
    """A job whose units spin for UNIT_MS and record where they ran and whether another unit overlapped."""

    engine = None
    max_unit_ms = UNIT_MS

    def __init__(self):
        self.in_unit = threading.Event()
        self.units = []   # (thread name, cores, torch threads)
        self.overlaps = 0

    def poll(self):
        assert not self.in_unit.is_set(), "the scheduler polled the job while a unit ran"

    def run_unit(self):
        if self.in_unit.is_set():
            self.overlaps += 1
        self.in_unit.set()
        self.units.append((threading.current_thread().name, sorted(os.sched_getaffinity(0)), torch.get_num_threads()))
        end = time.perf_counter() + UNIT_MS / 1e3
        while time.perf_counter() < end:
            pass
        self.in_unit.clear()
        return SimulatedUnit("unit", UNIT_MS, 10)


@needs_two_cores
def test_units_run_on_the_finetune_cores_across_steps_and_decode_on_its_own():
    job = RecordingJob()
    partitions = CorePartitions([(1, 1)], CORES[:2])
    controller = SpatialController(job, None, SloTracker(30.0, 100), partitions, "test", pinned=(1, 1))
    decode_cores = []
    try:
        for n in range(40):
            step = DecodeStep(n, 1, 10, time.perf_counter())
            controller.before_step(step)
            with controller.decode_stream_context():
                decode_cores.append((sorted(os.sched_getaffinity(0)), torch.get_num_threads()))
                time.sleep(0.01)  # the decode step: the unit thread runs beside it
            step.latency_ms = (time.perf_counter() - step.start_s) * 1e3
            controller.after_step(step, kv_demand_slots=1)
            assert (step.infer_sms, step.ft_sms) == (1, 1)
    finally:
        controller.close()
    co_run = [u for u in job.units if u[0] == "harvest-finetune-units"]
    assert co_run, "no unit ran beside decode"
    assert {tuple(c) for _, c, _ in co_run} == {(CORES[1],)} and {t for *_, t in co_run} == {1}
    assert decode_cores == [([CORES[0]], 1)] * 40
    assert job.overlaps == 0
    stats = controller.stats()
    assert stats["co_run"]["1,1"]["tokens"] == 10 * len(co_run)
    assert stats["co_run"]["1,1"]["grants"] == 1, "the partition was handed back and forth between steps"
    assert stats["granted"] is None, "close() left the partition granted"
    runner = stats["runner"]  # the co-run units' wall time, and how much of it the thread was on a core
    assert runner["unit_ms"] >= len(co_run) * UNIT_MS and 0 < runner["unit_cpu_ms"] <= runner["unit_ms"] + 1.0
    # What `harvest profile --co-run` reads from these stats: the partition's rate.
    assert co_run_rates_by_ft(stats["co_run"])[1] > 0
    assert sorted(os.sched_getaffinity(0)) == CORES, "the scheduler thread's cores were not restored"


def test_core_partitions_that_need_more_cores_than_the_host_has_are_refused():
    with pytest.raises(HarvestError, match="more than this worker's 2 cores"):
        CorePartitions([(2, 1)], [0, 1])


def core_profile(tmp_path):
    """A 2-core profile fitted to a device with known latency (a test fixture, labelled synthetic): decode on
    one core is 1.5x slower than on two, and one finetune core beside it trains almost as fast as two."""
    from predictor import Profile
    from predictor.finetune_throughput import FinetuneThroughput
    from predictor.partition_grid import PartitionGrid
    from predictor.sampling_plan import SamplingPlan
    from predictor.synthetic_device import SyntheticDevice

    grid = PartitionGrid(2, 1)
    plan = SamplingPlan(grid, 16, 512, num_held_out_per_partition=2)
    device = SyntheticDevice(grid, b0_ms=0.5, c0_ms=10.0, k0_ms=1e-3, k1=0.2, noise=0.01)
    throughput = (FinetuneThroughput(1, 90.0, 90.0, 5.0), FinetuneThroughput(2, 100.0, None, 5.0))
    return Profile.build(device.measure(plan.fit_points), grid, device_name="CPU: test device (SYNTHETIC)",
                         model="test", finetune_config_id="test", samples_path=tmp_path / "none.csv",
                         held_out=device.measure(plan.held_out_points, 1), finetune_throughput=throughput)


@needs_two_cores
def test_the_planner_picks_the_core_partition_per_step_and_decode_follows_it(tmp_path):
    from harvest.config import AdminConfig, Colocation, ServeConfig, colocation_mode
    from harvest.finetune import FinetuneConfig
    from predictor import SplitPlanner

    profile = core_profile(tmp_path)
    assert profile.partitions == ((1, 0), (2, 0), (1, 1))
    config = ServeConfig(admin=AdminConfig(), finetune=FinetuneConfig("cpu", yaml_path="job.yaml"), tpot_slo_ms=40.0)
    assert colocation_mode(config, profile) is Colocation.SPATIAL, "a CPU host's co-run profile makes the worker spatial"
    job = RecordingJob()
    planner = SplitPlanner(profile, 40.0)
    controller = SpatialController(job, planner, SloTracker(40.0, 100), CorePartitions(list(profile.partitions),
                                                                                        CORES[:2]), "test")
    seen = []
    try:
        for batch_size in (1, 16, 1, 16):   # one request: room for decode on one core; 16 x 512: none
            step = DecodeStep(0, batch_size, batch_size * 512, time.perf_counter())
            controller.before_step(step)
            units_before = len(job.units)
            with controller.decode_stream_context():
                cores = sorted(os.sched_getaffinity(0))
                time.sleep(0.02)
            step.latency_ms = controller.decision.predicted_ms  # as predicted: a busy host must not move the plan
            controller.after_step(step)
            co_ran = any(name == "harvest-finetune-units" for name, *_ in job.units[units_before:])
            seen.append(((controller.decision.infer_sms, controller.decision.ft_sms), cores, co_ran))
    finally:
        controller.close()
    assert [s[0] for s in seen] == [(1, 1), (2, 0)] * 2
    assert [s[1] for s in seen] == [CORES[:1], CORES[:2]] * 2
    assert [s[2] for s in seen] == [True, False] * 2


@needs_two_cores
def test_units_fit_the_shortest_step_with_a_profile_and_the_preemption_bound_without(tmp_path):
    """With a profile a co-run step ends in a slice that takes the partition back, so units fit its shortest step
    as a temporal worker's do; a spatial worker without one holds its partition across steps, and a unit is cut
    to the preemption bound."""
    from harvest.colocation.controller import PREEMPTION_BOUND_SHARE
    from harvest.config import AdminConfig, ServeConfig
    from harvest.finetune import FinetuneConfig
    from harvest.jobs import JobSet
    from harvest.runtime import _build_controller, _job_config, _planner

    profile = core_profile(tmp_path)
    config = ServeConfig(admin=AdminConfig(), finetune=FinetuneConfig("cpu", yaml_path="job.yaml"), tpot_slo_ms=40.0)
    planner = _planner(config, profile, None)
    partitions = CorePartitions(list(profile.partitions), CORES[:2])
    by_hand = dataclasses.replace(config, finetune=dataclasses.replace(config.finetune, max_unit_ms=5.0))
    for with_profile, serve_config in ((True, config), (False, config), (False, by_hand)):
        controller = _build_controller(serve_config, profile if with_profile else None,
                                       planner if with_profile else None, partitions, None, JobSet())
        try:
            assert controller.mode == "spatial"
            # A bound set by hand (--finetune-max-unit-ms) holds for co-run units too.
            assert controller.size_co_run_units == (serve_config is config)
        finally:
            controller.close()
    assert _job_config(config, planner, 0, None).max_unit_ms == planner.shortest_step_ms
    assert _job_config(config, None, 0, None).max_unit_ms == 40.0 * PREEMPTION_BOUND_SHARE
    # The spatial worker's planner weighs the wait for half a unit against each co-run; a temporal one's does not.
    assert _planner(config, profile, list(profile.partitions)).switch_ms == planner.shortest_step_ms / 2
    assert planner.switch_ms == 0.0


def test_a_cpu_workers_jobs_get_compiled_graphs_for_every_thread_count_their_units_run_with():
    """Decode's own thread count (a temporal worker's units run in its turns), the whole device's and each
    partition's finetune cores; a GPU job keeps none (its layers run eagerly)."""
    import torch

    from harvest.config import AdminConfig, ServeConfig
    from harvest.finetune import FinetuneConfig
    from harvest.runtime import _job_config

    config = ServeConfig(admin=AdminConfig(), finetune=FinetuneConfig("cpu", yaml_path="job.yaml",
                                                                      compile_layers=True), tpot_slo_ms=40.0)
    partitions = CorePartitions([(1, 1), (1, 0), (2, 0)], [0, 1])
    spatial = _job_config(config, None, 0, partitions)
    assert spatial.compile_layers and spatial.compile_thread_counts == tuple(sorted({torch.get_num_threads(), 1, 2}))
    assert _job_config(config, None, 0, None).compile_thread_counts == (torch.get_num_threads(),)
    gpu = dataclasses.replace(config, finetune=dataclasses.replace(config.finetune, device="cuda"))
    assert _job_config(gpu, None, 0, None).compile_thread_counts == ()


def test_the_admin_api_pins_and_unpins_a_spatial_workers_partition(tmp_path):
    from fastapi.testclient import TestClient

    from harvest.admin.admin_app import create_admin_app
    from harvest.config import AdminConfig, ServeConfig
    from harvest.finetune import FinetuneConfig
    from harvest.runtime import HarvestRuntime

    config = ServeConfig(admin=AdminConfig(), finetune=FinetuneConfig("cpu", yaml_path="job.yaml"), tpot_slo_ms=40.0,
                         pinned_partition=(1, 1))
    runtime = HarvestRuntime(config)
    runtime.controller = SpatialController(RecordingJob(), None, SloTracker(40.0, 10), CorePartitions([(1, 1)], [0, 1]),
                                           "test", pinned=(1, 1))
    client = TestClient(create_admin_app(runtime))
    try:
        assert client.post("/harvest/partition?infer=2&ft=0").json() == {"pinned": [2, 0]}
        assert runtime.controller.pinned == (2, 0)
        refused = client.post("/harvest/partition?infer=2&ft=1")
        assert refused.status_code == 409 and "not one this device forms" in refused.json()["detail"]
        unpin = client.post("/harvest/partition")
        assert unpin.status_code == 409 and "no --profile" in unpin.json()["detail"]
    finally:
        runtime.controller.close()
