"""The continuous finetune partition's hand-off rules, forced step by step with a job whose units end only
when the test lets them (no clock in any assertion): a granted partition stays with the unit thread across
steps; the scheduler thread never polls the job or moves memory while a unit runs; growing the window is a
request served at a later unit boundary, reclaiming KV for decode and taking the device back wait for the
unit in flight (a preemption), and no unit starts after either."""

import os
import sys
import threading

import pytest
from conftest import AlwaysReadyJob

from harvest.colocation.core_partitions import CorePartitions
from harvest.colocation.spatial_controller import SWITCH_INTERVAL_S, SpatialController
from harvest.replay.simulated_job import SimulatedUnit
from harvest.step_stats import DecodeStep, SloTracker

CORES = sorted(os.sched_getaffinity(0))
pytestmark = pytest.mark.skipif(len(CORES) < 2, reason="core partitions need two cores")
UNIT_THREAD = "harvest-finetune-units"
LIVENESS_S = 10.0
"""How long a call that must not block gets before the test calls it blocked (never reached when it passes)."""
QUIET_S = 0.3
"""How long the test watches for something that must not happen (a unit starting, a blocked call returning)."""


class Engine:
    is_shared = False
    num_window_layers = 1


class GatedJob(AlwaysReadyJob):
    """Each unit announces its start and ends when the test releases a permit."""

    max_unit_ms = 1.0

    def __init__(self):
        self.engine = Engine()
        self.permits = threading.Semaphore(0)
        self.started = threading.Semaphore(0)
        self.in_unit = False
        self.polls = []      # (thread name, a unit was in flight)
        self.units = []      # thread names

    def poll(self):
        self.polls.append((threading.current_thread().name, self.in_unit))

    def run_unit(self):
        assert not self.in_unit, "two units ran at once"
        self.in_unit = True
        self.units.append(threading.current_thread().name)
        self.started.release()
        assert self.permits.acquire(timeout=LIVENESS_S)
        self.in_unit = False
        return SimulatedUnit("unit", 1.0, 10)


class Lender:
    """The KvLender's side the controller reads (a real one needs SGLang's KV pool: test_kv_lending_e2e.py)."""

    def __init__(self, job):
        self.job = job
        self.engine = job.engine
        self.is_reclaim_needed = False
        self.is_growth_wanted = False
        self.rebalances = []   # a unit was in flight

    def needs_reclaim(self, kv_demand_slots):
        return self.is_reclaim_needed

    def may_grow(self):
        return self.is_growth_wanted

    def rebalance(self, kv_demand_slots, can_grow):
        self.rebalances.append(self.job.in_unit)
        return True


def call(fn, *args):
    """Run fn in a scheduler stand-in thread; the thread (joined by the caller)."""
    thread = threading.Thread(target=fn, args=args)
    thread.start()
    return thread


def finishes(thread, timeout_s=LIVENESS_S) -> bool:
    thread.join(timeout_s)
    return not thread.is_alive()


def test_the_partition_stays_with_the_unit_thread_and_changes_hands_only_at_unit_boundaries():
    job = GatedJob()
    lender = Lender(job)
    controller = SpatialController(job, None, SloTracker(1000.0, 100), CorePartitions([(1, 1), (2, 0)], CORES[:2]),
                                   "test", lender, pinned=(1, 1))
    steps = [DecodeStep(n, 1, 10, 0.0) for n in range(6)]
    for step in steps:
        step.latency_ms = 1.0

    def between_steps(step):
        controller.after_step(step, kv_demand_slots=1)

    try:
        controller.before_step(steps[0])
        assert job.started.acquire(timeout=LIVENESS_S), "no unit started on the granted partition"
        # A unit is in flight and cannot end: the step's end and the next step's start wait for nothing.
        assert finishes(call(between_steps, steps[0]))
        assert finishes(call(controller.before_step, steps[1]))
        assert (steps[0].infer_sms, steps[0].ft_sms, steps[1].preempt_ms) == (1, 1, 0.0)
        assert lender.rebalances == []

        # Growth wanted: a request, not a wait; the unit thread starts nothing once the unit in flight ends...
        lender.is_growth_wanted = True
        assert finishes(call(between_steps, steps[1]))
        assert lender.rebalances == [] and controller.num_grow_requests == 1
        job.permits.release()
        assert not job.started.acquire(timeout=QUIET_S), "a unit started while the scheduler asked for the job"
        # ... and after the next step the window grows at that boundary, and units run again.
        assert finishes(call(between_steps, steps[1]))
        assert lender.rebalances == [False]
        lender.is_growth_wanted = False
        assert job.started.acquire(timeout=LIVENESS_S), "units did not resume after the growth"

        # A growth asked for and no longer wanted at the next turn is withdrawn: units go on without it.
        lender.is_growth_wanted = True
        assert finishes(call(between_steps, steps[1]))
        assert controller.num_grow_requests == 2
        lender.is_growth_wanted = False
        job.permits.release()
        assert finishes(call(between_steps, steps[1]))
        assert job.started.acquire(timeout=LIVENESS_S), "a withdrawn request still held off the units"
        assert lender.rebalances == [False]

        # Decode needs its KV back: the rebalance waits for the unit in flight (a preemption).
        lender.is_reclaim_needed = True
        reclaim = call(between_steps, steps[2])
        assert not finishes(reclaim, QUIET_S), "the reclaim did not wait for the unit in flight"
        job.permits.release()
        assert finishes(reclaim)
        assert lender.rebalances == [False, False]
        lender.is_reclaim_needed = False
        assert job.started.acquire(timeout=LIVENESS_S)

        # Decode takes the whole device: the next step waits for the unit in flight, then no unit starts.
        controller.pinned = (2, 0)
        take_back = call(controller.before_step, steps[3])
        assert not finishes(take_back, QUIET_S), "the step took the device back while a unit ran"
        job.permits.release()
        assert finishes(take_back)
        assert steps[3].preempt_ms > 0.0 and steps[3].infer_sms == 2
        assert not job.started.acquire(timeout=QUIET_S), "a unit started on a revoked partition"
    finally:
        controller.close()
        for _ in range(4):
            job.permits.release()
    assert job.units == [UNIT_THREAD] * 4
    assert all(not in_unit for name, in_unit in job.polls if name != UNIT_THREAD), \
        "the scheduler thread polled the job while a unit ran"
    assert any(name == UNIT_THREAD for name, _ in job.polls), "the unit thread never polled the job it held"
    stats = controller.stats()
    assert stats["co_run"]["1,1"]["grants"] == 1 and stats["co_run"]["1,1"]["tokens"] == stats["co_run"]["1,1"]["unit_tokens"] == 40
    assert stats["preemptions"] == 2 and stats["granted"] is None


def test_the_scheduler_thread_stays_on_decode_cores_from_grant_to_revoke():
    """Not only its forwards: between them the scheduler thread would otherwise run on the job's cores."""
    job = GatedJob()
    controller = SpatialController(job, None, SloTracker(1000.0, 100), CorePartitions([(1, 1), (2, 0)], CORES[:2]),
                                   "test", pinned=(1, 1))
    seen = []

    def scheduler():
        before = os.sched_getaffinity(0)
        controller.before_step(DecodeStep(0, 1, 10, 0.0))
        seen.append(os.sched_getaffinity(0))  # between forwards, the partition granted
        controller.pinned = (2, 0)
        job.permits.release()
        controller.before_step(DecodeStep(1, 1, 10, 0.0))  # the device taken back
        seen.append(os.sched_getaffinity(0))
        seen.append(before)

    try:
        assert finishes(call(scheduler))
    finally:
        controller.close()
        for _ in range(2):
            job.permits.release()
    granted, revoked, before = seen
    assert granted == {CORES[0]} and revoked == before


def test_the_unit_thread_lives_from_a_grant_to_its_revoke_so_no_openmp_team_of_its_outlives_the_grant():
    """An OpenMP team lives as long as the thread that made it, and one beside the scheduler thread's makes libgomp
    stop its workers' spin-waiting (slower decode on the whole device): each grant gets a thread that the revoke
    ends. Here its units make a team of two threads."""
    import torch

    class TeamJob(AlwaysReadyJob):
        max_unit_ms = 1.0

        polled_on = []
        ran = threading.Semaphore(0)

        def poll(self):
            if threading.current_thread().name == UNIT_THREAD:
                self.polled_on.append(os.sched_getaffinity(0))

        def run_unit(self):
            before = torch.get_num_threads()  # also the count later threads start with: put back
            torch.set_num_threads(2)
            torch.ones(1 << 18).add_(1)  # a parallel op: the calling thread's OpenMP team
            torch.set_num_threads(before)
            self.ran.release()
            return SimulatedUnit("unit", 1.0, 10)

    def unit_threads():
        return [t for t in threading.enumerate() if t.name == UNIT_THREAD]

    job = TeamJob()
    controller = SpatialController(job, None, SloTracker(1000.0, 100),
                                   CorePartitions([(1, 1), (2, 0)], CORES[:2]), "test", pinned=(1, 1))
    try:
        assert unit_threads() == [], "no thread before a grant"
        for n in range(2):
            controller.pinned = (1, 1)
            controller.before_step(DecodeStep(2 * n, 1, 10, 0.0))
            assert len(unit_threads()) == 1
            assert job.ran.acquire(timeout=LIVENESS_S), "no unit ran on the granted partition"
            controller.pinned = (2, 0)
            controller.before_step(DecodeStep(2 * n + 1, 1, 10, 0.0))
            assert unit_threads() == [], "the unit thread outlived its grant"
    finally:
        controller.close()
    assert controller.stats()["runner"]["threads_started"] == 2
    # Made by the scheduler thread on decode's cores, the thread runs on the job's from its start, polls too.
    assert job.polled_on and all(cores == {CORES[1]} for cores in job.polled_on), job.polled_on


def test_a_unit_thread_beside_the_scheduler_thread_shortens_the_interpreters_switch_interval():
    """The two threads share one interpreter lock: with Python's default interval a thread coming back from a torch
    op or a compiled graph may wait 5 ms for the other to drop it. The simulator's runner shares nothing."""
    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.005)
        partitions = CorePartitions([(1, 1), (2, 0)], CORES[:2])
        SpatialController(AlwaysReadyJob(), None, SloTracker(1000.0, 100), partitions, "test", pinned=(1, 1),
                          runner=object())
        assert sys.getswitchinterval() == 0.005
        SpatialController(AlwaysReadyJob(), None, SloTracker(1000.0, 100), partitions, "test", pinned=(1, 1))
        assert sys.getswitchinterval() == SWITCH_INTERVAL_S
    finally:
        sys.setswitchinterval(before)
