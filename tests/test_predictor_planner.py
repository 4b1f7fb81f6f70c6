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


@settings(max_examples=200, deadline=None)
@given(latency_models(), shapes)
def test_co_run_decision_is_the_brute_force_best_and_never_exceeds_target(model, shape):
    batch_size, seq_len, target = shape
    decision = SplitPlanner(make_profile(model), target).plan(batch_size, seq_len, has_ready_work=True)
    fitting = [
        model.predict_colo_ms(i, f, batch_size, seq_len)
        for i, f in model.partitions()
        if f and model.predict_colo_ms(i, f, batch_size, seq_len) <= target
    ]
    full_sms = model.grid.num_sms
    solo_full = model.predict_solo_ms(full_sms, batch_size, seq_len)
    if fitting:
        assert decision.ft_sms > 0 and not decision.is_finetune_paused and not decision.is_slo_unreachable
        assert decision.predicted_ms <= target
        assert decision.predicted_ms == pytest.approx(max(fitting), rel=1e-12)
        assert decision.predicted_ms == pytest.approx(
            model.predict_colo_ms(decision.infer_sms, decision.ft_sms, batch_size, seq_len), rel=1e-12
        )
        assert model.grid.is_partition(decision.infer_sms, decision.ft_sms)
    else:
        assert (decision.infer_sms, decision.ft_sms) == (full_sms, 0)
        assert decision.is_finetune_paused
        assert decision.predicted_ms == pytest.approx(solo_full, rel=1e-12)
        assert decision.is_slo_unreachable == (solo_full > target)
    assert decision.slack_ms == pytest.approx(target - decision.predicted_ms)


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
    paused = planner.plan(32, 1000, True)
    assert (paused.infer_sms, paused.ft_sms, paused.is_finetune_paused, paused.is_slo_unreachable) == (
        132,
        0,
        True,
        False,
    )
    unreachable = SplitPlanner(make_profile(model), solo_full * 0.5).plan(32, 1000, True)
    assert unreachable.is_slo_unreachable and unreachable.is_finetune_paused and unreachable.slack_ms < 0
    roomy = SplitPlanner(make_profile(model), solo_full * 3).plan(32, 1000, True)
    assert roomy.ft_sms > 0 and 0 <= roomy.slack_ms < 0.25 * solo_full


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
