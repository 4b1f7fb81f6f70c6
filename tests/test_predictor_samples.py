"""Samples CSV: round trip, and every kind of bad row is rejected with its line number and reason."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from base.errors import HarvestError
from predictor.samples import CSV_COLUMNS, Sample, load_samples, write_samples

HEADER = ",".join(CSV_COLUMNS)

samples_strategy = st.builds(
    Sample,
    st.sampled_from([0.25, 0.5, 0.75, 1.0]),
    st.just(0.0),
    st.integers(1, 512),
    st.floats(0, 1e5, allow_nan=False),
    st.floats(1e-3, 1e4, allow_nan=False),
)


@settings(max_examples=30, deadline=None)
@given(st.lists(samples_strategy, min_size=1, max_size=20))
def test_write_then_load_round_trips(tmp_path_factory, samples):
    path = tmp_path_factory.mktemp("s") / "s.csv"
    write_samples(path, samples)
    assert load_samples(path) == samples


@pytest.mark.parametrize(
    "row, reason",
    [
        ("1.0,0,4,128", "expected 5 fields"),
        ("1.0,0,four,128,10", "batch_size is not a number"),
        ("1.0,0,4.5,128,10", "batch_size must be a whole number"),
        ("1.0,0,0,128,10", "batch_size must be an integer >= 1"),
        ("1.0,0,4,128,-2", "latency_ms must be a finite number > 0"),
        ("1.0,0,4,128,nan", "latency_ms must be a finite number > 0"),
        ("1.5,0,4,128,10", "infer_sm_ratio must be in (0, 1]"),
        ("0.75,0.5,4,128,10", "infer_sm_ratio + ft_sm_ratio must be <= 1"),
        ("1.0,0,4,-1,10", "seq_len must be a finite number >= 0"),
    ],
)
def test_bad_row_names_line_and_reason(tmp_path, row, reason):
    path = tmp_path / "s.csv"
    path.write_text(f"{HEADER}\n1.0,0,4,128,10.5\n{row}\n")
    with pytest.raises(HarvestError) as e:
        load_samples(path)
    assert f"{path}:3: " in str(e.value)
    assert reason in str(e.value)


def test_bad_header_and_empty_files_are_rejected(tmp_path):
    path = tmp_path / "s.csv"
    path.write_text("ratio,bs,latency\n1,2,3\n")
    with pytest.raises(HarvestError, match=r":1: header must be infer_sm_ratio"):
        load_samples(path)
    path.write_text("")
    with pytest.raises(HarvestError, match="empty file"):
        load_samples(path)
    path.write_text(HEADER + "\n")
    with pytest.raises(HarvestError, match="no samples"):
        load_samples(path)
    with pytest.raises(HarvestError, match="cannot read samples file"):
        load_samples(tmp_path / "missing.csv")


cells = st.sampled_from(["1.0", "0", "0.5", "4", "-3", "1e309", "nan", "x", "", " 2 ", "1,5", '"', "0.25"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(cells, min_size=0, max_size=7).map(",".join), min_size=1, max_size=5))
def test_arbitrary_rows_load_or_raise_harvest_error_with_line(tmp_path_factory, rows):
    path = tmp_path_factory.mktemp("s") / "s.csv"
    path.write_text("\n".join([HEADER, *rows]) + "\n")
    try:
        samples = load_samples(path)
    except HarvestError as e:
        assert str(e).startswith(str(path))
    else:
        assert all(isinstance(s, Sample) and s.latency_ms > 0 for s in samples)
