"""Online correction: a biased or stale profile converges to the measured latency, and the SLO holds."""

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_predictor_planner import fixed_model, make_profile

from predictor.partition_grid import PartitionGrid
from predictor.split_planner import REBUILD_EVERY, SplitPlanner
from predictor.synthetic_device import SyntheticDevice


def run_steps(planner: SplitPlanner, truth, num_steps: int, seed: int = 0, noise: float = 0.01):
    rng = random.Random(seed)
    log = []
    for step in range(num_steps):
        batch_size, seq_len = 16 + step % 8, 500.0 + step
        d = planner.plan(batch_size, seq_len, has_ready_work=True)
        measured = truth(d.infer_sms, d.ft_sms, batch_size, seq_len) * rng.lognormvariate(0.0, noise)
        planner.observe(d, measured)
        log.append((d, measured))
    return log


@settings(max_examples=20, deadline=None)
@given(st.floats(0.6, 1.8), st.integers(0, 1000))
def test_uniformly_biased_profile_converges(bias, seed):
    model = fixed_model()
    planner = SplitPlanner(make_profile(model), 30.0)
    log = run_steps(planner, lambda i, f, b, s: bias * model.predict_colo_ms(i, f, b, s), 80, seed)
    errors = [abs(d.predicted_ms - m) / m for d, m in log[-20:]]
    assert sum(errors) / len(errors) < 0.03
    assert planner.stats().global_correction == pytest.approx(bias, rel=0.03)
    violations = [m > 30.0 * 1.05 for _, m in log[-20:]]
    assert sum(violations) <= 2


def test_stale_colo_model_converges_per_partition_and_stats_show_it():
    """A profile whose co-run slowdown is half the truth (k1 0.5 vs 1.0): the partitions used converge."""
    model = fixed_model()
    device = SyntheticDevice(PartitionGrid(132, 8), k1=1.0)
    truth = lambda i, f, b, s: (1.0 + 1.0 * f / 132) * model.predict_solo_ms(i, b, s)  # noqa: E731
    planner = SplitPlanner(make_profile(model), 30.0)
    log = run_steps(planner, truth, 150, noise=0.0)
    first = sum(abs(d.predicted_ms - m) / m for d, m in log[:10]) / 10
    last = sum(abs(d.predicted_ms - m) / m for d, m in log[-20:]) / 20
    assert last < 0.01 < first
    stats = planner.stats()
    assert stats.num_observed == 150
    used = {(d.infer_sms, d.ft_sms) for d, _ in log[-20:]}
    for partition in used:
        truth_ratio = device.slowdown(*partition) / model.slowdown(*partition)
        assert stats.partitions[partition]["correction"] == pytest.approx(truth_ratio, rel=0.02)
    d = stats.to_dict()
    assert d["num_observed"] == 150 and d["last_measured_ms"] == pytest.approx(log[-1][1])
    assert {"infer_sms", "ft_sms", "mean_predicted_ms", "mean_measured_ms", "mape", "correction"} <= set(
        d["partitions"][0]
    )


observations = st.lists(st.tuples(st.integers(1, 256), st.floats(1, 4096), st.floats(0.5, 2.0)), max_size=30)


def correction(planner: SplitPlanner, partition, key: str = "correction") -> float:
    stats = planner.stats()
    return stats.partitions.get(partition, {}).get(key, stats.global_correction)


@settings(max_examples=60, deadline=None)
@given(observations, st.integers(1, 256), st.floats(0, 4096), st.floats(5.0, 200.0), st.floats(0.0, 0.3))
def test_decision_is_brute_force_best_of_corrected_predictions(history, batch_size, seq_len, target, margin):
    """Pins the row build: after any observations (and a refresh), plan() equals enumeration of every
    candidate's corrected prediction (correction(partition) * model prediction), a co-run one feasible
    when it stays within target * (1 - margin) and valued at its optimistic correction's prediction."""
    model = fixed_model()
    planner = SplitPlanner(make_profile(model), target, plan_margin=margin)
    for b, s, bias in history:
        d = planner.plan(b, s, has_ready_work=True)
        planner.observe(d, d.model_ms * bias)
    planner.refresh()  # observe() rebuilds rows lazily
    decision = planner.plan(batch_size, seq_len, has_ready_work=True)
    full = correction(planner, (132, 0)) * model.predict_solo_ms(132, batch_size, seq_len)
    values = {(132, 0): max(0.0, target - full)}
    for i, f in model.partitions():
        d = correction(planner, (i, f)) * model.predict_colo_ms(i, f, batch_size, seq_len)
        if f and d <= target * (1 - margin):
            valued = correction(planner, (i, f), "valued_at_correction") * model.predict_colo_ms(i, f, batch_size, seq_len)
            values[(i, f)] = f / 132 * valued + target - valued  # proxy rates: SM shares
    assert decision.finetune_tokens_per_s * target == pytest.approx(max(values.values()), rel=1e-9, abs=1e-9)
    assert values[(decision.infer_sms, decision.ft_sms)] == pytest.approx(max(values.values()), rel=1e-9, abs=1e-9)
    assert decision.model_ms == pytest.approx(
        model.predict_colo_ms(decision.infer_sms, decision.ft_sms, batch_size, seq_len), rel=1e-9
    )
    if decision.ft_sms:
        assert decision.predicted_ms <= target * (1 - margin) * (1 + 1e-12)
    else:
        assert decision.predicted_ms == pytest.approx(full, rel=1e-9)


@pytest.mark.parametrize("noise", [0.05, 0.10])
def test_learned_margin_keeps_the_target_under_noise_without_a_hand_set_margin(noise):
    """The profile 20 % optimistic and the device noisy: after a warm-up the learned margin covers the
    spread (its device-wide factor near exp(3.09 sigma)) and >= 99.9 % of co-run steps stay within target."""
    model = fixed_model()
    target = 3.0 * model.predict_solo_ms(132, 16, 1000)  # room for co-running on about half the SMs
    planner = SplitPlanner(make_profile(model), target)
    rng = random.Random(3)
    log = []
    for step in range(20_000):
        batch_size, seq_len = 16 + step % 8, 500.0 + step % 1000
        d = planner.plan(batch_size, seq_len, has_ready_work=True)
        measured = 1.2 * model.predict_colo_ms(d.infer_sms, d.ft_sms, batch_size, seq_len)
        planner.observe(d, measured * rng.lognormvariate(0.0, noise))
        log.append((d, measured))
    log = log[2000:]
    co_run = [(d, m) for d, m in log if d.ft_sms]
    assert len(co_run) > 0.01 * len(log)  # the margin is exercised on real co-run steps
    assert sum(m <= target for _, m in co_run) / len(co_run) >= 0.999
    assert planner.margin.device() == pytest.approx(math.exp(3.09 * noise), rel=0.25)



def test_a_partition_priced_out_by_one_slow_step_is_tried_again_and_kept_where_it_is_fast():
    """Seen live on the 2-core host: one cold first co-run step ran ~2x its prediction, the co-run partition's
    correction priced it out, decode-only steps never measured it again, and a whole run stayed off it. Its
    value forgets a slow offset while it is unused (feasibility does not): it is tried again at the next row
    refresh and kept once its measurements agree with the model; where it really is slow, only probed."""
    from predictor.profile import Profile
    from predictor.split_planner import REFRESH_EVERY

    profile = Profile.load("predictor/profiles/cpu-cores-smollm2-135m.json")
    for really_slow in (False, True):
        planner = SplitPlanner(profile, 300.0)
        for _ in range(50):  # the job still building: decode alone
            d = planner.plan(1, 200.0, has_ready_work=False)
            planner.observe(d, d.model_ms)
        first = planner.plan(1, 200.0, has_ready_work=True)
        assert (first.infer_sms, first.ft_sms) == (1, 1)  # the profile's best at batch 1
        planner.observe(first, 2.0 * first.predicted_ms)  # one cold step
        picks = []
        for _ in range(6 * REFRESH_EVERY):
            d = planner.plan(1, 200.0, has_ready_work=True)
            assert d.predicted_ms * d.margin <= 300.0 or not d.ft_sms
            co_run = (d.infer_sms, d.ft_sms) == (1, 1)
            planner.observe(d, d.model_ms * (2.0 if co_run and really_slow else 1.0))
            picks.append(co_run)
        assert sum(picks[:REFRESH_EVERY - 1]) == 0  # priced out until the first refresh
        if really_slow:
            assert sum(picks) <= 6 * REBUILD_EVERY  # probed a few steps per refresh, not kept
        else:
            assert all(picks[-REFRESH_EVERY:])  # back, and kept
