"""SplitPlanner: the decision equals brute force over all partitions, and its edge-case flags."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from base.errors import HarvestError
from predictor.colo_model import ColoModel
from predictor.fit_metrics import FitMetrics
from predictor.latency_model import LatencyModel
from predictor.partition_grid import PartitionGrid
from predictor.profile import Profile, SamplesSource
from predictor.solo_model import SoloCoefficients, SoloModel
from predictor.split_planner import SplitPlanner

NO_METRICS = FitMetrics(0, None, None)
H100 = PartitionGrid(132, 8)
GRIDS = [H100, PartitionGrid(10, 1), PartitionGrid(64, 16)]


def make_profile(model: LatencyModel) -> Profile:
    return Profile(
        "test", model.grid, "m", "f", "2026-11-22T00:00:00Z", SamplesSource("x", "", 0), model, NO_METRICS, NO_METRICS
    )


@st.composite
def latency_models(draw):
    grid = draw(st.sampled_from(GRIDS))
    positive = st.floats(1e-3, 10.0)
    solo = SoloModel(
        draw(st.sampled_from([1, 2, 4, 8])),
        tuple(
            SoloCoefficients(sms, draw(positive), draw(positive), draw(st.floats(0.0, 1e-2)))
            for sms in grid.infer_options()
        ),
        {},
    )
    k1, m1 = draw(st.floats(0.0, 2.0)), draw(st.floats(-0.5, 2.0))
    return LatencyModel(grid, solo, ColoModel("eq5_bandwidth_infer", 1.0, 0.0, k1, m1, ()))


shapes = st.tuples(st.integers(1, 512), st.floats(0.0, 8192.0), st.floats(0.5, 500.0))


def brute_force_best(model, batch_size, seq_len, target, margin=1.0, pairs=None):
    """(value, partition) of every candidate, best first: finetune tokens over a budget of `target` ms when
    decode takes d ms on (i, f) and the whole device finetunes for the rest (rates: SM shares, the proxy a
    profile without finetune throughput plans with); a co-run candidate must keep d * margin <= target."""
    n = model.grid.num_sms
    solo_full = model.predict_solo_ms(n, batch_size, seq_len)
    values = [(max(0.0, target - solo_full), (n, 0))]
    for i, f in model.partitions():
        d = model.predict_colo_ms(i, f, batch_size, seq_len)
        if f and d * margin <= target and (pairs is None or (i, f) in pairs):
            values.append((f / n * d + (target - d), (i, f)))
    return sorted(values, reverse=True)


@settings(max_examples=200, deadline=None)
@given(latency_models(), shapes)
def test_decision_is_the_brute_force_best_candidate_and_never_exceeds_target(model, shape):
    batch_size, seq_len, target = shape
    planner = SplitPlanner(make_profile(model), target, plan_margin=0.0)
    decision = planner.plan(batch_size, seq_len, has_ready_work=True)
    assert "PROXY" in planner.rate_source
    best_value, _ = brute_force_best(model, batch_size, seq_len, target)[0]
    n = model.grid.num_sms
    d = model.predict_colo_ms(decision.infer_sms, decision.ft_sms, batch_size, seq_len)
    value = max(0.0, target - d) + decision.ft_sms / n * d
    assert value == pytest.approx(best_value, rel=1e-9, abs=1e-9)
    assert decision.finetune_tokens_per_s * target == pytest.approx(best_value, rel=1e-9, abs=1e-9)
    assert decision.predicted_ms == pytest.approx(d, rel=1e-12)
    assert model.grid.is_partition(decision.infer_sms, decision.ft_sms)
    if decision.ft_sms:
        assert decision.predicted_ms <= target and not decision.is_finetune_paused
    else:
        assert decision.is_finetune_paused == (d >= target)
        assert decision.is_slo_unreachable == (d > target)
    assert decision.slack_ms == pytest.approx(target - decision.predicted_ms)


@settings(max_examples=100, deadline=None)
@given(latency_models(), shapes, st.randoms(use_true_random=False))
def test_the_planner_picks_only_partitions_the_device_forms(model, shape, rng):
    """Pins defect 9's planner half: a partition the driver's split cannot form (GreenPartitions.dropped_pairs)
    is never planned; among the rest the decision is still the brute-force best."""
    batch_size, seq_len, target = shape
    co_run = [(i, f) for i, f in model.partitions() if f]
    formed = set(rng.sample(co_run, len(co_run) // 2))
    decision = SplitPlanner(make_profile(model), target, plan_margin=0.0, pairs=formed).plan(batch_size, seq_len, True)
    assert decision.ft_sms == 0 or (decision.infer_sms, decision.ft_sms) in formed
    best_value, _ = brute_force_best(model, batch_size, seq_len, target, pairs=formed)[0]
    assert decision.finetune_tokens_per_s * target == pytest.approx(best_value, rel=1e-9, abs=1e-9)


@settings(max_examples=100, deadline=None)
@given(latency_models(), shapes, st.floats(0.0, 0.5))
def test_a_margin_keeps_co_run_predictions_that_far_below_the_target(model, shape, margin):
    batch_size, seq_len, target = shape
    decision = SplitPlanner(make_profile(model), target, plan_margin=margin).plan(batch_size, seq_len, True)
    if decision.ft_sms:
        assert decision.predicted_ms <= target * (1 - margin) * (1 + 1e-12)
    best_value, _ = brute_force_best(model, batch_size, seq_len, target, 1 / (1 - margin))[0]
    assert decision.finetune_tokens_per_s * target == pytest.approx(best_value, rel=1e-9, abs=1e-9)


@settings(max_examples=100, deadline=None)
@given(latency_models(), shapes)
def test_without_ready_work_decode_gets_every_sm(model, shape):
    batch_size, seq_len, target = shape
    decision = SplitPlanner(make_profile(model), target).plan(batch_size, seq_len, has_ready_work=False)
    solo_full = model.predict_solo_ms(model.grid.num_sms, batch_size, seq_len)
    assert (decision.infer_sms, decision.ft_sms) == (model.grid.num_sms, 0)
    assert not decision.is_finetune_paused
    assert decision.predicted_ms == pytest.approx(solo_full, rel=1e-12)
    assert decision.is_slo_unreachable == (solo_full > target)


def fixed_model(grid: PartitionGrid = H100, colo: bool = True) -> LatencyModel:
    """Llama3-8B-on-H100-like eq. 2 lines, slower on fewer SMs as (num_sms / sms) ** 0.6; eq. 5 with k1 = 0.5."""
    solo = SoloModel(
        4,
        tuple(
            SoloCoefficients(sms, *(v * (grid.num_sms / sms) ** 0.6 for v in (0.05, 6.0, 4e-5)))
            for sms in grid.infer_options()
        ),
        {},
    )
    return LatencyModel(grid, solo, ColoModel("eq5_bandwidth", 1.0, 0.0, 0.5, 0.0, ()) if colo else None)


def test_edge_cases_on_a_gpu_profile():
    model = fixed_model()
    solo_full = model.predict_solo_ms(132, 32, 1000)
    planner = SplitPlanner(make_profile(model), solo_full * 1.001)
    tight = planner.plan(32, 1000, True)
    # 0.1 % of slack: no co-run pair fits, and the slice after decode alone is nearly nothing.
    assert (tight.infer_sms, tight.ft_sms, tight.is_finetune_paused, tight.is_slo_unreachable) == (
        132,
        0,
        False,
        False,
    )
    assert tight.finetune_tokens_per_s == pytest.approx(1 - 1 / 1.001)  # proxy rates: the whole device is 1
    unreachable = SplitPlanner(make_profile(model), solo_full * 0.5).plan(32, 1000, True)
    assert unreachable.is_slo_unreachable and unreachable.is_finetune_paused and unreachable.slack_ms < 0
    assert unreachable.finetune_tokens_per_s == 0
    roomy = SplitPlanner(make_profile(model), solo_full * 3).plan(32, 1000, True)
    assert not roomy.is_finetune_paused and roomy.slack_ms > solo_full and roomy.finetune_tokens_per_s > 0


def test_cpu_profile_reports_slack_for_temporal_sharing():
    model = fixed_model(PartitionGrid(1, 1), colo=False)
    solo = model.predict_solo_ms(1, 8, 100)
    room = SplitPlanner(make_profile(model), solo + 5.0).plan(8, 100, True)
    assert (room.infer_sms, room.ft_sms, room.is_finetune_paused) == (1, 0, False)
    assert room.slack_ms == pytest.approx(5.0)
    full = SplitPlanner(make_profile(model), solo - 1.0).plan(8, 100, True)
    assert full.is_finetune_paused and full.is_slo_unreachable and full.slack_ms == pytest.approx(-1.0)


def test_bad_arguments_are_rejected():
    planner = SplitPlanner(make_profile(fixed_model()), 30.0)
    with pytest.raises(HarvestError, match="batch_size >= 1"):
        planner.plan(0, 10, True)
    with pytest.raises(HarvestError, match="positive number of ms"):
        planner.observe(planner.plan(4, 10, True), -1.0)
    with pytest.raises(HarvestError, match="TPOT SLO"):
        SplitPlanner(make_profile(fixed_model()), 0.0)


def test_equal_finetune_tokens_break_toward_the_lower_decode_latency():
    """Pins the tie-break (issue 19): (4, 6) and (5, 5) train exactly the same tokens over the budget (proxy
    rates: 6/10 of the device for 5 ms, or 5/10 for 4 ms, then the same slice per ms left) and every other
    candidate trains fewer. The planner takes (5, 5), whose 4 ms decode keeps TPOT lower; before the
    tie-break it kept the first row it met, (4, 6) with 5 ms."""
    grid = PartitionGrid(10, 1)
    # Step latency is c0 and a negligible b0 (the planner's pruning divides by it): i * solo_i is 20 for
    # rows 4 and 5 (up to 1e-9 relative), 30 for the rest.
    solo_ms = {i: 30.0 / i for i in grid.infer_options()} | {4: 5.0, 5: 4.0}
    solo = SoloModel(1, tuple(SoloCoefficients(i, 1e-9, ms, 0.0) for i, ms in solo_ms.items()), {})
    model = LatencyModel(grid, solo, ColoModel("eq5_bandwidth", 1.0, 0.0, 0.0, 0.0, ()))
    values = brute_force_best(model, 8, 100.0, 10.0)
    assert values[0][0] == pytest.approx(values[1][0], rel=1e-9)
    assert {values[0][1], values[1][1]} == {(4, 6), (5, 5)} and values[2][0] < 0.99 * values[0][0]
    decision = SplitPlanner(make_profile(model), 10.0, plan_margin=0.0).plan(8, 100.0, has_ready_work=True)
    assert (decision.infer_sms, decision.ft_sms) == (5, 5)
    assert decision.predicted_ms == pytest.approx(4.0)
    assert decision.finetune_tokens_per_s * 10.0 == pytest.approx(values[0][0], rel=1e-9)
