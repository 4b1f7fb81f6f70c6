"""The split a spatial worker without a profile runs (harvest.colocation.split_chooser): chosen by what each
split trained in its phases, with a clock the test moves and the rates of recorded phases plus noise."""

import os
import random
import time

import pytest
from conftest import AlwaysReadyJob

from harvest.colocation.core_partitions import CorePartitions
from harvest.colocation.spatial_controller import SpatialController
from harvest.colocation.split_chooser import (
    EXPLORE_EVERY,
    MAX_WARMUP_PHASES,
    MIN_PHASE_STEPS,
    PHASE_S,
    CAP_PHASES,
    SplitChooser,
)
from harvest.replay.simulated_job import SimulatedUnit
from harvest.step_stats import DecodeStep, SloTracker

PAIR = (1, 1)
STEPS_PER_PHASE = 20


class Clock:
    def __init__(self):
        self.now = 0.0
        self.work = 0.0
        """The job's work so far (tokens through its units), which run_phases adds to."""

    def __call__(self):
        return self.now


def run_phases(chooser, clock, rates, num_phases, misses=lambda split, phase: False, noise=0.0, seed=0,
               is_learned=lambda split: True, missed_batch=1):
    """Drive decode steps until `num_phases` phases have run; `rates(split, phase)`: tokens/s the split trains
    then; `misses(split, phase)`: its fourth step, at a batch of `missed_batch` (the others at 1), misses the
    target. Returns the split of every phase from the chooser's current one on."""
    rng = random.Random(seed)
    chosen, step_in_phase, first = [], 0, chooser.phase
    dt = PHASE_S / STEPS_PER_PHASE
    while chooser.phase < num_phases:
        split = chooser.split_for_step(clock.work, is_learned)
        phase = chooser.phase
        if len(chosen) == phase - first:
            chosen.append(split)
            step_in_phase = 0
        assert chosen[phase - first] == split, "the split changed inside a phase"
        clock.now += dt
        clock.work += rates(split, phase) * dt * max(0.0, 1 + rng.gauss(0, noise))
        missed = misses(split, phase) and step_in_phase == 3
        chooser.record_step(clock.work, not missed, missed_batch if missed else 1)
        step_in_phase += 1
    return chosen


def test_each_split_is_measured_then_the_faster_one_runs_and_the_slower_is_tried_less_and_less():
    clock = Clock()
    chooser = SplitChooser([(2, 0), PAIR], clock)
    assert chooser.splits == [None, PAIR], "a pair without finetune units is the whole device's, not a split"
    chosen = run_phases(chooser, clock, lambda split, phase: 60.0 if split == PAIR else 30.0, 200, noise=0.2)
    assert chosen[:4] == [PAIR, PAIR, None, None], "the even split first; each split's warm-up, then measured"
    tries = [n for n, split in enumerate(chosen) if split is None][2:]
    gaps = [b - a for a, b in zip(tries, tries[1:])]
    assert gaps and gaps[0] >= EXPLORE_EVERY[0] and gaps[-1] > gaps[0] and max(gaps) <= EXPLORE_EVERY[1] + 1
    assert chosen.count(PAIR) / len(chosen) > 0.9
    stats = chooser.stats()
    assert stats["splits"]["1,1"]["unit_tokens_per_s"] > stats["splits"]["whole"]["unit_tokens_per_s"]


def test_a_warmup_lasts_until_the_split_is_learned_or_its_bound_and_a_learned_split_warms_up_in_one_phase():
    clock = Clock()
    chooser = SplitChooser([PAIR], clock)
    learned_from = 7.0 * PHASE_S  # the whole device's decode cost line is fitted after this much time on it
    whole_s = [0.0]

    def is_learned(split):
        return split is not None or whole_s[0] >= learned_from

    def rates(split, phase):
        if split is None:
            whole_s[0] += PHASE_S / STEPS_PER_PHASE
            return 10.0 if whole_s[0] < learned_from else 90.0  # its slices are cut to nothing until then
        return 60.0

    chosen = run_phases(chooser, clock, rates, 10, is_learned=is_learned)
    warmup = [p for p in chooser.recent if p["split"] == "whole" and p["warmup"]]
    assert len(warmup) == 1 and warmup[0]["steps"] >= 7 * STEPS_PER_PHASE, "one warm-up, until learned"
    assert chosen[3:].count(None) >= 5, "once learned, the whole device measured as the faster split"
    # Never learned: the warm-up ends at its bound, and the split is measured as it is.
    chooser = SplitChooser([PAIR], clock)
    run_phases(chooser, clock, lambda split, phase: 60.0, 6, is_learned=lambda split: split is not None)
    warmup = [p for p in chooser.recent if p["split"] == "whole" and p["warmup"]]
    assert warmup and MAX_WARMUP_PHASES * STEPS_PER_PHASE <= warmup[0]["steps"] <= (MAX_WARMUP_PHASES + 1) * STEPS_PER_PHASE
    assert chooser.records[None].num_phases >= 1


def test_the_choice_follows_the_load_when_the_faster_split_changes():
    clock = Clock()
    chooser = SplitChooser([PAIR], clock)

    def rates(split, phase):  # light load: the partition wins; from phase 100 on, heavy: the whole device
        return (70.0 if split == PAIR else 40.0) if phase < 100 else (20.0 if split == PAIR else 50.0)

    chosen = run_phases(chooser, clock, rates, 200, noise=0.1)
    assert chosen[60:100].count(PAIR) >= 30
    assert chosen[100:104].count(None) >= 2, "the whole device took over within a few phases"
    assert chosen[-40:].count(None) >= 36


def test_a_miss_at_a_batch_of_one_ends_the_partitions_phase_and_sets_it_aside_for_longer_each_time():
    clock = Clock()
    chooser = SplitChooser([PAIR], clock)
    chosen = run_phases(chooser, clock, lambda split, phase: 60.0 if split == PAIR else 30.0, 120,
                        misses=lambda split, phase: split == PAIR)
    pair_phases = [n for n, split in enumerate(chosen) if split == PAIR]
    gaps = [b - a for a, b in zip(pair_phases, pair_phases[1:])]
    assert gaps[:4] == [CAP_PHASES[0] * 2 ** n for n in range(4)], gaps
    assert chooser.records[PAIR].num_misses == len(pair_phases)
    assert chosen.count(None) / len(chosen) > 0.9
    # The whole device is never capped: a miss there is the slice's back-off's to handle.
    chooser = SplitChooser([PAIR], clock)
    run_phases(chooser, clock, lambda split, phase: 30.0 if split == PAIR else 60.0, 20, misses=lambda s, p: True)
    assert chooser.max_batch(None) == float("inf") and chooser.records[None].num_misses == 0


def test_a_miss_at_a_larger_batch_caps_the_partitions_batch_below_it_and_the_partition_keeps_running():
    clock = Clock()
    chooser = SplitChooser([PAIR], clock)
    # The pair trains faster; its fifth phase (its fourth measured) misses once, at a batch of 5.
    chosen = run_phases(chooser, clock, lambda split, phase: 60.0 if split == PAIR else 30.0, 3 + CAP_PHASES[0],
                        misses=lambda split, phase: split == PAIR and phase == 4, missed_batch=5)
    assert chosen[4] == PAIR and chooser.records[PAIR].num_misses == 1
    assert chooser.max_batch(PAIR) == 4, "batches of 5 and more go to the whole device for a while"
    assert chosen[5:] == [PAIR] * (CAP_PHASES[0] - 1), "the partition was not set aside"
    run_phases(chooser, clock, lambda split, phase: 60.0 if split == PAIR else 30.0, 4 + CAP_PHASES[0] + 1)
    assert chooser.max_batch(PAIR) == float("inf"), "the cap lasts its phases"
    # Misses while capped only bring the cap down, and one at a batch of 1 sets the partition aside.
    for missed_batch, cap in ((3, 2), (6, 2), (1, 0)):
        num_misses = chooser.records[PAIR].num_misses
        while chooser.records[PAIR].num_misses == num_misses:
            run_phases(chooser, clock, lambda split, phase: 60.0 if split == PAIR else 30.0, chooser.phase + 1,
                       misses=lambda split, phase: split == PAIR, missed_batch=missed_batch)
        assert chooser.max_batch(PAIR) == cap, (missed_batch, chooser.records[PAIR])
    assert PAIR not in chooser._eligible()


def test_idle_gaps_count_for_the_current_split_unless_longer_than_a_phase_and_unready_time_for_none():
    clock = Clock()
    chooser = SplitChooser([PAIR], clock)
    work = 0.0

    def step(gap_s=0.0, gap_work=0.0, step_s=0.01, split=PAIR):
        nonlocal work
        clock.now += gap_s
        work += gap_work
        assert chooser.split_for_step(work) == split
        clock.now += step_s
        work += 1.0
        chooser.record_step(work, True, 1)

    for _ in range(MIN_PHASE_STEPS):
        step(step_s=PHASE_S / MIN_PHASE_STEPS)
    assert chooser.phase == 0
    chooser.skip()  # the warm-up phase ends at the next step, its time then counted for no split
    for _ in range(MIN_PHASE_STEPS):
        step()
    step(gap_s=0.5, gap_work=100.0)  # idle turns between two steps: whole-device units, counted
    step(gap_s=10 * PHASE_S, gap_work=500.0)  # an idle stretch longer than a phase: counted for no split
    chooser.skip()  # the job had no ready work until the next step
    step(gap_s=0.3, gap_work=50.0, step_s=PHASE_S)
    assert chooser.phase == 1, "a phase ended before PHASE_S were counted"
    assert chooser.records[PAIR].unit_tokens_per_s is None, "the warm-up phase measured a split"
    assert chooser.split_for_step(work) is None, "the whole device, unmeasured, runs next"
    pair = chooser.recent[-1]
    assert pair["split"] == "1,1" and pair["unit_tokens_per_s"] == pytest.approx(
        (MIN_PHASE_STEPS + 100 + 3) / (MIN_PHASE_STEPS * 0.01 + 0.5 + 0.02 + PHASE_S), abs=1e-3)


def test_a_split_takes_the_lead_only_on_two_phases_of_its_own():
    """A lull in the whole device's first measured phase (phase 3) makes it look faster than the partition
    once: it runs again at once, and the partition leads again when its running rate falls behind. A whole
    device that stays faster takes the lead after those two phases."""
    def lull(split, phase):
        return 60.0 if split == PAIR else (80.0 if phase == 3 else 30.0)

    clock = Clock()
    chooser = SplitChooser([PAIR], clock)
    chosen = run_phases(chooser, clock, lull, 12)
    assert chosen[:6] == [PAIR, PAIR, None, None, None, PAIR] and chosen[6:].count(PAIR) == 6
    assert chooser.leader == PAIR
    chooser = SplitChooser([PAIR], clock)
    chosen = run_phases(chooser, clock, lambda split, phase: 60.0 if split == PAIR else 100.0, 12)
    assert chosen[:5] == [PAIR, PAIR, None, None, None] and chooser.leader is None
    assert chosen[5:].count(None) >= 6


class Job(AlwaysReadyJob):
    engine = None
    max_unit_ms = 2.0
    is_ready = True

    def has_ready_work(self):
        return self.is_ready

    def poll(self):
        pass

    def run_unit(self):
        end = time.perf_counter() + 0.002
        while time.perf_counter() < end:
            pass
        return SimulatedUnit("unit", 2.0, 10)


def chosen_controller(chooser, job):
    """A spatial controller without planner or pin, on the host's first two cores: it runs `chooser`'s split."""
    cores = sorted(os.sched_getaffinity(0))[:2]
    return SpatialController(job, None, SloTracker(30.0, 100), CorePartitions([PAIR], cores), "test", chooser=chooser)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="core partitions need two cores")
def test_a_spatial_controller_without_planner_or_pin_runs_the_chosen_split_and_records_it_per_step():
    # Phases counted on a clock that moves 4 ms a step, not on the host's: a slow or busy host would end the
    # whole device's warm-up by its cap on time (MAX_WARMUP_PHASES) before its line is learned.
    clock = Clock()
    chooser = SplitChooser([PAIR], clock, phase_s=0.05)
    job = Job()
    controller = chosen_controller(chooser, job)
    records = []
    try:
        for n in range(240):
            clock.now += 0.004
            job.is_ready = n >= 20  # the first steps: the job's engine is still being built
            # Batches of 1 to 3: the whole device's decode cost line is fitted within its warm-up.
            step = DecodeStep(n, 1 + n % 3, 10, time.perf_counter())
            controller.before_step(step)
            with controller.decode_stream_context():
                time.sleep(0.003)
            step.latency_ms = (time.perf_counter() - step.start_s) * 1e3
            controller.after_step(step)
            records.append((step.infer_sms, step.ft_sms))
            if n == 19:
                assert chooser.phase == 0, "steps without ready work measured a split"
    finally:
        controller.close()
    assert set(records) == {(2, 0), (1, 1)}, "both splits ran and the records say which"
    stats = controller.stats()["chooser"]
    assert stats["phase"] >= 2 and all(s["phases"] for s in stats["splits"].values())
    assert controller.batch_cost.is_learned, "the whole device's warm-up ran until its line was learned"
    # A 50 ms phase may end before its unit thread's first unit on a slow host: the split's phases trained.
    assert any(p["unit_tokens_per_s"] > 0 for p in stats["recent_phases"] if p["split"] == "1,1"), stats
    assert controller.stats()["co_run"]["1,1"]["tokens"] > 0


def test_the_wait_for_a_partitions_unit_is_not_fitted_as_decode_cost():
    """A step after a revoke waited for the unit in flight (preempt_ms): the slice's fit of decode alone must not
    take that wait for decode's cost, or its overrun quantile cuts the slices of every whole-device step after it."""
    from harvest.colocation.controller import TemporalController

    class IdleJob(Job):
        is_ready = False

    controller = TemporalController(IdleJob(), None, SloTracker(300.0, 1000), "test")
    for n in range(256):
        batch = 1 + n % 4
        step = DecodeStep(n, batch, 10, time.perf_counter())
        step.preempt_ms = 40.0 if n % 8 == 0 else 0.0
        step.latency_ms = 10.0 * batch + step.preempt_ms
        controller.after_step(step)
    assert controller.batch_cost.slope_ms == pytest.approx(10.0, abs=0.01)
    assert controller.batch_cost.overrun_quantile == pytest.approx(1.0, abs=0.01)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="core partitions need two cores")
def test_steps_pinned_through_the_admin_api_measure_no_split():
    chooser = SplitChooser([PAIR], phase_s=10.0)
    controller = chosen_controller(chooser, Job())

    def step(n):
        s = DecodeStep(n, 1, 10, time.perf_counter())
        controller.before_step(s)
        s.latency_ms = 1.0
        controller.after_step(s)

    try:
        step(0)
        span_before = chooser._span_s
        controller.pinned = PAIR  # POST /harvest/partition
        for n in range(1, 20):
            step(n)
        time.sleep(0.2)
        controller.pinned = None
        step(20)
    finally:
        controller.close()
    assert chooser._span_s - span_before < 0.1, "the pinned stretch was counted for the chooser's split"


def after_a_step_on_the_pair(job):
    """(chooser, controller) after one decode step on the chosen (1, 1), the job's unit thread granted it."""
    chooser = SplitChooser([PAIR], phase_s=10.0)
    controller = chosen_controller(chooser, job)
    step = DecodeStep(0, 1, 10, time.perf_counter())
    controller.before_step(step)
    step.latency_ms = 1.0
    controller.after_step(step)
    assert step.infer_sms == 1, "the step ran on the chosen partition"
    return chooser, controller


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="core partitions need two cores")
def test_the_idle_turn_that_takes_the_partition_back_runs_no_unit_so_a_batch_waits_for_one_unit_at_most():
    """The first idle turn takes the partition back, waiting for the unit thread's unit in flight, and runs none
    itself (the loop comes straight back); the next turns train on the whole device, one unit each; the step
    after them takes nothing back."""
    _, controller = after_a_step_on_the_pair(Job())
    try:
        time.sleep(0.01)  # the unit thread runs units back to back meanwhile
        assert controller.on_idle() == 0 and controller.idle_turn_worked, "the take-back turn asks for no wait"
        assert controller.num_preemptions == 1 and controller.num_units_idle == 0, "it ran a unit after the wait"
        for n in range(1, 4):
            controller.on_idle()
            assert controller.idle_turn_worked and controller.num_units_idle == n
        step = DecodeStep(1, 1, 10, time.perf_counter())
        controller.before_step(step)
        assert step.preempt_ms == 0.0, "the batch after the idle turns waited for a partition's unit"
        step.latency_ms = 1.0
        controller.after_step(step)
    finally:
        controller.close()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="core partitions need two cores")
def test_an_idle_turn_that_trains_counts_for_the_current_split_and_one_without_ready_work_for_none():
    job = Job()
    chooser, controller = after_a_step_on_the_pair(job)
    try:
        controller.on_idle()  # takes the partition back
        controller.on_idle()
        assert controller.num_units_idle == 1
        assert chooser._last_end is not None, "an idle turn the job trained in was counted for no split"
        job.is_ready = False
        controller.on_idle()
        assert chooser._last_end is None, "an idle turn without ready work was counted for the split"
    finally:
        controller.close()
