"""Torch-free policies of the finetune engine: the resident-layer window and the unit sizer."""

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harvest.finetune import unit_sizer
from harvest.finetune.unit_sizer import UnitSizer
from harvest.finetune.window_policy import WindowPolicy


def count_fetches(policy: WindowPolicy, layer_sequence: list[int], num_window_layers: int) -> int:
    """Host-to-device layer loads a run over `layer_sequence` costs under `policy`."""
    resident: set[int] = set()
    num_fetches = 0
    for index, layer_id in enumerate(layer_sequence):
        if layer_id not in resident:
            resident.add(layer_id)
            num_fetches += 1
        target = set(policy.target_layers(layer_sequence[index + 1 :], num_window_layers))
        num_fetches += len(target - resident)
        resident = target
    return num_fetches


@st.composite
def policy_and_future(draw):
    num_layers = draw(st.integers(1, 12))
    window = draw(st.integers(1, num_layers))
    future = draw(st.lists(st.integers(0, num_layers - 1), max_size=40))
    return WindowPolicy(num_layers), window, future


@given(policy_and_future())
def test_target_is_the_soonest_distinct_layers_and_fills_the_window(case):
    policy, window, future = case
    target = policy.target_layers(future, window)
    assert len(target) == window == len(set(target))
    assert all(0 <= layer_id < policy.num_layers for layer_id in target)
    if future:
        assert target[0] == future[0]
    seen = list(dict.fromkeys(future))[:window]
    assert target[: len(seen)] == seen


@given(st.integers(1, 10), st.integers(1, 4))
def test_full_window_fetches_each_layer_once_and_smaller_windows_fetch_more(num_layers, num_passes):
    policy = WindowPolicy(num_layers)
    sequence = policy.pass_order() * num_passes
    assert count_fetches(policy, sequence, num_layers) == num_layers
    fetches = [count_fetches(policy, sequence, w) for w in range(1, num_layers + 1)]
    assert fetches == sorted(fetches, reverse=True)
    # With W layers, the turn at the top of the pass reuses the W layers already resident.
    assert fetches[0] == len(sequence) - (num_passes * 2 - 1)


def test_window_out_of_range_is_rejected():
    with pytest.raises(ValueError, match="num_window_layers"):
        WindowPolicy(4).target_layers([], 5)
    with pytest.raises(ValueError, match="num_layers"):
        WindowPolicy(0)


@given(
    st.integers(1, 64),
    st.integers(1, 4096),
    st.floats(0.01, 1e4),
    st.floats(1e-5, 10.0),
    st.one_of(st.none(), st.integers(1, 64)),
)
def test_rows_per_chunk_fits_the_budget_and_stays_in_range(num_rows, tokens_per_row, max_unit_ms, ms_per_token, cap):
    sizer = UnitSizer(max_unit_ms=max_unit_ms, max_slice_rows=cap, smoothing=1.0)
    assert sizer.rows_per_slice(num_rows, tokens_per_row) == 1  # nothing timed yet: the smallest unit
    assert UnitSizer(max_slice_rows=cap).rows_per_slice(num_rows, tokens_per_row) == min(num_rows, cap or num_rows)
    sizer.observe("backward", 100, ms_per_token * 100)
    rows = sizer.rows_per_slice(num_rows, tokens_per_row)
    assert 1 <= rows <= num_rows
    if cap is not None:
        assert rows <= cap
    if rows > 1:
        assert rows * tokens_per_row * ms_per_token <= max_unit_ms * (1 + 1e-9)
    looser = UnitSizer(max_unit_ms=max_unit_ms * 2, max_slice_rows=cap, smoothing=1.0)
    looser.observe("backward", 100, ms_per_token * 100)
    assert looser.rows_per_slice(num_rows, tokens_per_row) >= rows


def test_sizer_follows_the_slowest_unit_kind():
    sizer = UnitSizer(max_unit_ms=10.0)
    sizer.observe("forward", 100, 1.0)
    sizer.observe("backward", 100, 5.0)
    assert sizer.cost("backward") == pytest.approx((0.0, 0.05))  # one size timed: all of it per token
    assert sizer.rows_per_slice(64, 10) == 20


def test_a_unit_timed_at_zero_ms_does_not_make_the_cost_zero():
    """A unit under the clock's resolution is no measurement: a zero per-token cost divided the bound by zero."""
    sizer = UnitSizer(max_unit_ms=10.0)
    sizer.observe("forward", 100, 0.0)
    assert sizer.cost("forward") is None and sizer.rows_per_slice(64, 10) == 1
    sizer.observe("forward", 100, 1.0)
    sizer.observe("forward", 200, 0.0)
    assert sizer.cost("forward") == pytest.approx((0.0, 0.01))
    assert sizer.rows_per_slice(64, 10) == 64  # 10 ms at 0.01 ms per token: 1000 tokens, all 64 rows of 10


@given(st.integers(1, 16), st.integers(1, 2048), st.floats(0.01, 1e3), st.floats(1e-5, 10.0))
def test_head_spans_tile_the_sequence_and_fit_the_budget(num_rows, seq_len, max_unit_ms, ms_per_token):
    sizer = UnitSizer(max_unit_ms=max_unit_ms, smoothing=1.0)
    assert sizer.head_spans(num_rows, seq_len) == [(0, seq_len)]  # nothing measured: one head unit
    sizer.observe("head", 100, ms_per_token * 100)
    sizer.observe("head", 200, ms_per_token * 200)  # a line: one size alone is taken as the head's fixed cost
    spans = sizer.head_spans(num_rows, seq_len)
    assert spans[0][0] == 0 and spans[-1][1] == seq_len
    assert all(end > start for start, end in spans) and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    if len(spans) < seq_len:  # one position per span is as small as a head unit gets
        assert max(end - start for start, end in spans) * num_rows * ms_per_token <= max_unit_ms * (1 + 1e-9)


def test_rows_are_sized_by_the_slowest_kind_but_the_head():
    sizer = UnitSizer(max_unit_ms=10.0, smoothing=1.0)
    sizer.observe("backward", 100, 5.0)
    sizer.observe("head", 100, 50.0)
    sizer.observe("head", 200, 100.0)
    assert sizer.rows_per_slice(64, 10) == 20  # the head, 10x slower, is cut along the sequence instead
    assert len(sizer.head_spans(20, 10)) == 10


def drive(sizer: UnitSizer, kind: str, fixed_ms: float, ms_per_token: float, num_rows: int, seq_len: int,
          steps: int = 6) -> list[int]:
    """Size a kind's units step after step on a synthetic cost (fixed + per token); the last step's unit sizes
    (tokens). Padded lengths differ between micro-batches, so the sizes vary."""
    sizes = []
    for step in range(steps):
        length = seq_len - step % 2
        if kind == "head":
            sizes = [num_rows * (end - start) for start, end in sizer.head_spans(num_rows, length)]
        else:
            rows = sizer.rows_per_slice(num_rows, length)
            sizes = [(min(start + rows, num_rows) - start) * length for start in range(0, num_rows, rows)]
        for tokens in sizes:
            sizer.observe(kind, tokens, fixed_ms + ms_per_token * tokens)
    return sizes


@pytest.mark.parametrize("fixed_ms", [0.0, 5.0, 15.0, 30.0])
def test_a_unit_with_a_fixed_cost_is_not_cut_into_pieces_that_are_mostly_that_cost(fixed_ms):
    """The demo job's head costs ~15 ms whatever its span: cut on per-token cost alone it went to spans of ~2
    tokens at an 18.6 ms bound. The fitted line keeps a unit's per-token work at least its fixed cost, and
    within the bound wherever the bound leaves room for that."""
    bound, per_token = 18.6, 0.05
    for kind, num_rows, seq_len in (("head", 4, 96), ("backward", 64, 32)):
        size = max(drive(UnitSizer(max_unit_ms=bound, smoothing=1.0), kind, fixed_ms, per_token, num_rows, seq_len))
        assert fixed_ms + per_token * size <= max(bound, 2 * fixed_ms) * (1 + 1e-9)
        granule = per_token * (num_rows if kind == "head" else seq_len)  # the smallest step a cut can take
        if fixed_ms + per_token * num_rows * seq_len > bound:  # it had to be cut
            # equal spans (or rows) round the cut down, to half of it at worst
            assert per_token * size >= (max(bound - fixed_ms, fixed_ms) - granule) / 2


def test_one_stalled_unit_does_not_tilt_the_cost_line():
    """A first unit that also loaded data ran 100x its size's time: rows still follow the other sizes."""
    sizer = UnitSizer(max_unit_ms=75.0, smoothing=1.0)
    sizer.observe("embed", 46, 114.6)  # the stall
    for tokens in (42, 44, 29, 23, 27, 30):
        sizer.observe("embed", tokens, 0.6 + 0.01 * tokens)
        sizer.observe("backward", tokens, 6.6 + 0.05 * tokens)
    assert sizer.cost("embed") == pytest.approx((0.6, 0.01))
    assert sizer.rows_per_slice(4, 96) == 4  # backward: 6.6 + 0.05 x 384 tokens = 25.8 ms fits 75


def test_the_stats_give_each_kinds_line_and_the_fallback_that_puts_its_whole_time_on_positions():
    sizer = UnitSizer(max_unit_ms=75.0, smoothing=1.0)
    for tokens in (42, 44, 29):
        sizer.observe("backward", tokens, 6.6 + 0.05 * tokens)
    for tokens, ms in ((100, 5.0), (200, 4.0)):  # no growth with size: a launch-bound unit, say
        sizer.observe("forward", tokens, ms)
    costs = sizer.costs()
    assert costs["backward"] == pytest.approx([6.6, 0.05]) and costs["forward"] == pytest.approx([0.0, 0.035])


@pytest.mark.parametrize("fixed_ms", [5.0, 15.0, 30.0, 100.0])
def test_a_head_whose_fixed_cost_is_over_the_bound_is_split_over_the_vocabulary(fixed_ms):
    """Cut along the sequence a head still runs up to twice its fixed cost (its weight read): over the bound,
    each span is split over K vocabulary chunks in 2K units of about 1/(2K) of its time each."""
    bound, per_token = 18.6, 0.05
    sizer = UnitSizer(max_unit_ms=bound, smoothing=1.0)
    assert sizer.head_vocab_parts(100, max_parts=48) == 0  # nothing timed: whole
    sizes = drive(sizer, "head", fixed_ms, per_token, 4, 96)
    for tokens in sizes:
        whole_ms = fixed_ms + per_token * tokens
        parts = sizer.head_vocab_parts(tokens, max_parts=48)
        if whole_ms <= bound:
            assert parts == 0
        else:
            assert parts >= 1 and whole_ms / (2 * parts) <= bound * (1 + 1e-9)
            assert parts == 1 or whole_ms / (2 * (parts - 1)) > bound  # no more chunks than needed
    assert sizer.head_vocab_parts(max(sizes), max_parts=0) == 0  # a head that cannot be split stays whole
    assert sizer.head_vocab_parts(10_000, max_parts=3) <= 3


@given(update_ms=st.floats(0.01, 500.0), bound=st.floats(1.0, 100.0), max_parts=st.integers(1, 64))
def test_an_optimizer_update_is_cut_into_as_few_parts_as_fit_the_bound(update_ms, bound, max_parts):
    sizer = UnitSizer(max_unit_ms=bound, smoothing=1.0)
    assert sizer.optimizer_parts(max_parts) == max_parts  # untimed: as fine as allowed
    sizer.observe_optimizer(update_ms)
    parts = sizer.optimizer_parts(max_parts)
    assert 1 <= parts <= max_parts
    assert parts == max_parts or update_ms / parts <= bound * (1 + 1e-9)
    assert parts == 1 or update_ms / (parts - 1) > bound  # no more parts than needed
    assert UnitSizer().optimizer_parts(max_parts) == 1  # no bound: whole


@pytest.mark.parametrize("logits_share", [0.5, 0.6, 0.75])
def test_a_split_heads_vocabulary_chunks_fit_the_bound_at_its_heavier_pass(logits_share):
    """A split head is timed whole (its 2K units summed) with the share of its heavier pass: K is cut so
    that pass's units (K of them) fit the bound, not the mean unit (the logits pass ran ~1.5x the gradient's)."""
    bound = 18.6
    sizer = UnitSizer(max_unit_ms=bound, smoothing=1.0)
    for tokens in (8, 16, 24, 32):
        whole_ms = 40.0 + 0.5 * tokens
        sizer.observe_split_head(tokens, logits_share * whole_ms, (1 - logits_share) * whole_ms)
    assert sizer.cost("head") == pytest.approx((40.0, 0.5))
    for tokens in (8, 30, 100, 400):
        heavy_ms = logits_share * (40.0 + 0.5 * tokens)
        parts = sizer.head_vocab_parts(tokens, max_parts=48)
        assert heavy_ms / parts <= bound * (1 + 1e-9)
        assert parts == 1 or heavy_ms / (parts - 1) > bound  # no more chunks than needed


@pytest.mark.parametrize("sizes", [[44], [2, 6, 7, 20, 24]])
def test_a_head_whose_time_does_not_grow_with_its_span_is_cut_over_the_vocabulary_not_the_sequence(sizes):
    """One size timed, or times that do not grow with size (a head is mostly its weight read on a CPU): the
    head is taken as all fixed cost, so its span stays whole and the vocabulary is chunked; taken as all per
    token, it was cut to spans of 2 tokens that each still ran ~40 ms against an 18.6 ms bound."""
    bound = 18.6
    sizer = UnitSizer(max_unit_ms=bound, smoothing=1.0)
    for n, tokens in enumerate(sizes):
        sizer.observe("head", tokens, 40.0 - 0.1 * n)  # no growth with size
    fixed, per_token = sizer.cost("head")
    assert per_token == 0 and fixed == pytest.approx(40.0, abs=0.5)
    assert sizer.head_spans(1, 96) == [(0, 96)]
    assert sizer.head_vocab_parts(96, max_parts=48) == 2  # a pass, half of 40 ms, in chunks under 18.6 ms
    sizer.observe("forward", 10, 20.0)  # a layer kind keeps the per-token fallback: rows are cut
    assert sizer.cost("forward") == (0.0, 2.0) and sizer.rows_per_slice(4, 10) == 1


def _share_over_bound(sizer: UnitSizer, rng: random.Random, sigma: float, steps: int = 400) -> float:
    """Size a layer kind's units step after step on a known line (0.01 ms per position, no fixed part) times
    log-normal noise of `sigma`; the share of units over the bound after the first 50."""
    over = 0
    for step in range(steps):
        rows = sizer.rows_per_slice(256, 32)
        ms = 0.01 * rows * 32 * math.exp(rng.gauss(0.0, sigma))
        sizer.observe("backward", rows * 32, ms)
        over += step >= 50 and ms > sizer.max_unit_ms
    return over / (steps - 50)


@pytest.mark.parametrize("sigma", [0.1, 0.3])
def test_a_kinds_overrun_is_the_99th_percentile_of_its_units_over_its_line(sigma):
    """Units timed at spread sizes on a known line (2 ms + 0.01 ms per position) times log-normal noise: the
    overrun is about exp(2.33 sigma), and about 1 % of fresh units run over the line times it."""
    rng = random.Random(0)
    sizer = UnitSizer(max_unit_ms=18.6)
    for _ in range(200):
        positions = rng.randint(100, 2000)
        sizer.observe("backward", positions, (2.0 + 0.01 * positions) * math.exp(rng.gauss(0.0, sigma)))
    assert sizer.overrun("backward") == pytest.approx(math.exp(2.33 * sigma), rel=0.2)
    fixed, per_position = sizer.cost("backward")
    draws = [rng.randint(100, 2000) for _ in range(2000)]
    over = sum((2.0 + 0.01 * n) * math.exp(rng.gauss(0.0, sigma)) > (fixed + per_position * n) * sizer.overrun("backward")
               for n in draws)
    assert over / len(draws) <= 0.03


@pytest.mark.parametrize("sigma", [0.1, 0.3])
def test_units_sized_by_the_sizer_stay_within_the_bound_on_99_percent_of_draws(sigma):
    """Closed loop: the sizer cuts each unit from what it timed before, the unit runs with noise."""
    assert _share_over_bound(UnitSizer(max_unit_ms=18.6), random.Random(0), sigma) <= 0.03


def test_a_kinds_overrun_is_one_until_enough_units_are_timed_and_follows_its_spread():
    sizer = UnitSizer(max_unit_ms=18.6)
    for n in range(unit_sizer.MIN_SPREAD_SAMPLES + 1):  # the first unit has no line to be measured against
        assert sizer.overrun("backward") == 1.0
        sizer.observe("backward", 100, 10.0 * (1.2 if n % 2 else 1 / 1.2))
    assert sizer.overrun("backward") > 1.2  # log-spread ~0.25: exp(2.33 x 0.25 + its mean)
    sizer.observe_optimizer(10.0)
    for n in range(unit_sizer.MIN_SPREAD_SAMPLES + 1):
        sizer.observe_optimizer(10.0)
    assert sizer.overrun("optimizer") == 1.0  # no spread: the update is cut at its time
