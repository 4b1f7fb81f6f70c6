"""Each step past the target gets one cause: the first part of its time that, added up in the order of
`miss_cause`, crosses the target (what the live tests and `harvest bench slo` count misses by)."""

import pytest

from harvest.step_stats import MISS_CAUSES, miss_cause

TARGET_MS = 100.0


def step(latency_ms, finetune_ms=0.0, idle_wait_ms=0.0, **parts):
    return {"latency_ms": latency_ms, "finetune_ms": finetune_ms, "idle_wait_ms": idle_wait_ms, **parts}


@pytest.mark.parametrize("record, cause", [
    (step(60, finetune_ms=40), None),  # exactly at the target is in it
    (step(101), "decode"),
    (step(101, ft_sms=1), "co_run"),
    (step(101, preempt_ms=2), "co_run"),    # decode alone fit; the wait for the partition's unit did not
    (step(101, preempt_ms=0.5), "decode"),  # decode alone was past the target already
    (step(90, idle_wait_ms=20), "wait"),
    (step(90, finetune_ms=20, co_run_tail_ms=15), "co_run"),
    (step(60, finetune_ms=50, memory_ms=45), "memory"),
    (step(60, finetune_ms=50, planned_ms=40), "overrun"),  # as planned the slice ended at the target
    (step(60, finetune_ms=50, planned_ms=41), "slice"),    # the plan itself was past the target
    (step(60, finetune_ms=50, idle_wait_ms=5, memory_ms=30, planned_ms=10), "slice"),
    (step(60, finetune_ms=50, overrun_ms=10), "overrun"),  # no planned_ms: the slice less its overrun
    (step(60, finetune_ms=50, overrun_ms=9), "slice"),
])
def test_a_miss_is_given_the_part_of_the_step_that_crossed_the_target(record, cause):
    assert miss_cause(record, TARGET_MS) == cause
    assert cause is None or cause in MISS_CAUSES


def test_records_without_the_parts_count_their_slice_as_planned():
    """Step records from before the parts existed (recordings in eval/) read as decode, wait or slice."""
    assert miss_cause(step(50, finetune_ms=60), TARGET_MS) == "slice"
