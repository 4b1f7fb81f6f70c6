"""Fitting recovers the coefficients of eqs. 2 and 3 from noisy samples of a known synthetic device."""

import pytest

from base.errors import HarvestError
from predictor.latency_model import LatencyModel
from predictor.partition_grid import PartitionGrid
from predictor.samples import Sample
from predictor.sampling_plan import SamplePoint, SamplingPlan
from predictor.synthetic_device import SyntheticDevice

H100 = PartitionGrid.from_name("h100")


def fit(device: SyntheticDevice, seed: int = 0) -> tuple[LatencyModel, SamplingPlan]:
    plan = SamplingPlan(device.grid, max_batch_size=256, max_seq_len=4096, seed=seed)
    return LatencyModel.fit(device.measure(plan.fit_points, seed), device.grid), plan


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_recovers_solo_coefficients_and_plateau(seed):
    device = SyntheticDevice(H100, noise=0.02)
    model, _ = fit(device, seed)
    assert model.solo.plateau_batch_size == device.plateau_batch_size
    for sms in (8, 64, 132):
        c = model.solo.coefficients(sms)
        scale = H100.ratio(sms) ** -device.sm_exponent
        assert c.b0_ms == pytest.approx(device.b0_ms * scale, rel=0.15)
        assert c.c0_ms == pytest.approx(device.c0_ms * scale, rel=0.05)
        assert c.k0_ms == pytest.approx(device.k0_ms * scale, rel=0.05)


def test_without_plateau_the_knot_is_one():
    device = SyntheticDevice(H100, plateau_batch_size=1, noise=0.01)
    model, _ = fit(device)
    assert model.solo.plateau_batch_size == 1
    assert set(model.solo.plateau_rel_rmse) == {1, 2, 4, 8, 16}


@pytest.mark.parametrize("seed", [0, 1])
def test_recovers_bandwidth_slowdown_and_keeps_simplest_form(seed):
    device = SyntheticDevice(H100, k1=0.5, noise=0.02)
    model, _ = fit(device, seed)
    assert model.colo.form == "eq5_bandwidth"
    assert model.colo.k1 == pytest.approx(0.5, abs=0.05)
    assert model.slowdown(64, 0) == 1.0
    forms = {f.form: f for f in model.colo.candidates}
    assert forms["eq3_as_printed"].cv_mape > forms["eq5_bandwidth"].cv_mape


def test_interaction_term_is_kept_when_the_data_need_it():
    device = SyntheticDevice(H100, k1=0.3, m1=1.5, noise=0.01)
    model, _ = fit(device)
    assert model.colo.form == "eq5_bandwidth_infer"
    assert model.colo.k1 == pytest.approx(0.3, abs=0.06)
    assert model.colo.m1 == pytest.approx(1.5, abs=0.2)


def test_printed_eq3_wins_when_the_data_follow_it():
    """Pins that the comparison is real: data made by eq. 3 as printed select it (not a pinned default)."""
    device = SyntheticDevice(H100, a1=0.0, b1=1.2, k1=0.6, noise=0.01)
    model, _ = fit(device)
    assert model.colo.form in ("eq3_as_printed", "eq3_intercept")
    assert model.colo.b1 == pytest.approx(1.2, abs=0.1)
    assert model.colo.k1 == pytest.approx(0.6, abs=0.1)


def test_held_out_error_is_near_the_noise_floor():
    device = SyntheticDevice(H100, noise=0.02)
    model, plan = fit(device)
    solo, colo = model.score(device.measure(plan.held_out_points, seed=7))
    assert solo.n > 0 and colo.n > 0
    assert solo.mape < 3.0 and colo.mape < 4.0


def test_cpu_profile_has_no_colo_model():
    grid = PartitionGrid.from_name("cpu")
    device = SyntheticDevice(grid, c0_ms=40.0, b0_ms=1.0, k0_ms=1e-3, noise=0.03)
    plan = SamplingPlan(grid, max_batch_size=16, max_seq_len=512)
    model = LatencyModel.fit(device.measure(plan.fit_points), grid)
    assert model.colo is None
    assert model.partitions() == [(1, 0)]
    assert model.predict_solo_ms(1, 8, 256) == pytest.approx(device.solo_ms(1, 8, 256), rel=0.05)
    with pytest.raises(HarvestError, match="no co-run model"):
        model.predict_colo_ms(1, 1, 8, 256)


def test_underdetermined_or_off_grid_samples_are_explained():
    grid = PartitionGrid.from_name("h100")
    one_batch_size = [Sample(1.0, 0.0, 4, float(s), 10.0 + s / 100) for s in (16, 64, 256)]
    with pytest.raises(HarvestError, match="at 132 SMs: need >= 3 distinct"):
        LatencyModel.fit(one_batch_size, grid)
    with pytest.raises(HarvestError, match="not a whole number of the device's 132 SMs"):
        LatencyModel.fit([Sample(0.3, 0.0, 4, 16.0, 10.0)], grid)
    device = SyntheticDevice(grid)
    solo = device.measure([SamplePoint(132, 0, b, s, False) for b in (1, 8, 64) for s in (16, 1024)])
    orphan = device.measure([SamplePoint(64, 64, b, 512, False) for b in (1, 8, 64, 128)])
    with pytest.raises(HarvestError, match="co-run samples at 64 inference SMs need solo samples"):
        LatencyModel.fit(solo + orphan, grid)
