"""SamplingPlan: few points, all on the grid and in range, fit and held-out disjoint, held-out inside the
fitted range, enough to fit."""

from hypothesis import given, settings
from hypothesis import strategies as st

from predictor.latency_model import LatencyModel
from predictor.partition_grid import PartitionGrid
from predictor.sampling_plan import SamplingPlan
from predictor.synthetic_device import SyntheticDevice

grids = st.sampled_from([PartitionGrid(132, 8), PartitionGrid(1, 1), PartitionGrid(108, 2), PartitionGrid(10, 1)])


@settings(max_examples=60, deadline=None)
@given(grids, st.integers(1, 512), st.integers(1, 32768), st.none() | st.integers(2, 10**6))
def test_points_are_valid_and_split(grid, max_batch_size, max_seq_len, max_kv_tokens):
    plan = SamplingPlan(grid, max_batch_size, max_seq_len, max_kv_tokens)
    points = plan.points()
    assert len(points) == len(set(points))
    for p in points:
        assert grid.is_partition(p.infer_sms, p.ft_sms)
        assert 1 <= p.batch_size <= max_batch_size and 1 <= p.seq_len <= max_seq_len
        if max_kv_tokens is not None:
            assert p.batch_size * p.seq_len <= max_kv_tokens
    fit = {(p.infer_sms, p.ft_sms, p.batch_size, p.seq_len) for p in plan.fit_points}
    held_out_pairs = {(p.infer_sms, p.ft_sms) for p in plan.held_out_points if p.ft_sms}
    assert not held_out_pairs & set(plan.colo_pairs())
    assert fit.isdisjoint({(p.infer_sms, p.ft_sms, p.batch_size, p.seq_len) for p in plan.held_out_points})
    levels = plan.seq_levels()
    for p in plan.held_out_points:
        # Inside the fitted range: the KV cap may only shorten a shape, as it shortens fit shapes.
        assert p.seq_len <= levels[-1]
        if max_kv_tokens is None:
            assert levels[0] <= p.seq_len


def test_cpu_plan_has_the_1_2_3_series_three_lengths_and_held_out_inside():
    """Pins the CPU profile's design: 8 batch sizes x 3 lengths, 12 held-out shapes between them."""
    plan = SamplingPlan(PartitionGrid.from_name("cpu"), 16, 1024, 16 * (1024 + 64), num_held_out_per_partition=12)
    assert plan.batch_sizes() == [1, 2, 3, 4, 6, 8, 12, 16]
    assert plan.seq_levels() == (32, 528, 1024)
    assert len(plan.fit_points) == 24
    held_out = plan.held_out_points
    assert len(held_out) == 12
    assert all(1 <= p.batch_size <= 16 and 32 <= p.seq_len <= 1024 for p in held_out)
    assert SamplingPlan(PartitionGrid.from_name("cpu"), 10, 100).batch_sizes() == [1, 2, 3, 4, 6, 8, 10]


def test_h100_plan_is_far_smaller_than_harli_and_fits_well():
    grid = PartitionGrid.from_name("h100")
    plan = SamplingPlan(grid, max_batch_size=256, max_seq_len=4096)
    num_colo_fit = sum(1 for p in plan.fit_points if p.ft_sms)
    assert len(plan.colo_pairs()) <= 9 < len(grid.pairs())
    # HARLI stage 2: 45 pairs x 3 batch sizes x a sweep of 512 lengths; here 6 shapes per pair.
    assert num_colo_fit <= 9 * 6
    assert all(p.seq_len in plan.seq_levels() for p in plan.fit_points)
    device = SyntheticDevice(grid, noise=0.02)
    model = LatencyModel.fit(device.measure(plan.fit_points), grid)
    solo, colo = model.score(device.measure(plan.held_out_points, seed=3))
    assert solo.mape < 3.0 and colo.mape < 4.0
