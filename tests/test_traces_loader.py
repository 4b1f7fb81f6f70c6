"""Trace loading (good and broken CSVs), windowing, rate scaling, length capping, synthetic generators."""

import csv
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from base.errors import HarvestError
from traces.synthetic_trace import SyntheticTrace
from traces.trace import Trace
from traces.trace_loader import load_csv, load_trace, shipped_traces

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def write(tmp_path, body: str, name="t.csv"):
    path = tmp_path / name
    path.write_text(HEADER + body)
    return path


def test_azure_format_with_seven_fractional_digits_loads_rebased_and_sorted(tmp_path):
    path = write(
        tmp_path,
        "2023-11-16 18:15:47.2500000,10,3\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n",
    )
    trace = load_csv(path)
    assert trace.num_requests == 3
    np.testing.assert_allclose(trace.arrival_s, [0.0, 0.5694100, 4.3145790], atol=1e-6)
    assert trace.context_tokens.tolist() == [374, 10, 396]
    assert trace.generated_tokens.tolist() == [44, 3, 109]


def test_seconds_timestamps_are_accepted(tmp_path):
    trace = load_csv(write(tmp_path, "0.5,10,2\n2.0,20,4\n"))
    np.testing.assert_allclose(trace.arrival_s, [0.0, 1.5])


@pytest.mark.parametrize("name", ["conv", "code"])
def test_shipped_traces_match_their_csv(name):
    with open(shipped_traces()[name]) as f:
        rows = list(csv.reader(f))[1:]
    trace = load_trace(name)
    assert trace.num_requests == len(rows)
    assert trace.num_generated_tokens == sum(int(r[2]) for r in rows)
    assert int(trace.context_tokens.sum()) == sum(int(r[1]) for r in rows)
    assert trace.arrival_s[0] == 0 and np.all(np.diff(trace.arrival_s) >= 0)
    assert 3000 < trace.duration_s < 3600  # both are one-hour traces


@pytest.mark.parametrize(
    "body, expected",
    [
        ("2023-11-16 18:15:46.68,10,3\n2023-13-16 18:15:47.00,10,3\n", ":3: TIMESTAMP"),
        ("2023-11-16 18:15:46.68,10,3\nyesterday,10,3\n", ":3: TIMESTAMP 'yesterday'"),
        ("2023-11-16 18:15:46.68,-5,3\n", ":2: ContextTokens must be >= 0, got -5"),
        ("2023-11-16 18:15:46.68,5,3\n2023-11-16 18:15:47.68,5,-1\n", ":3: GeneratedTokens must be >= 1, got -1"),
        ("2023-11-16 18:15:46.68,5,0\n", ":2: GeneratedTokens must be >= 1, got 0"),
        ("2023-11-16 18:15:46.68,5.5,3\n", ":2: ContextTokens '5.5' is not a whole number"),
        ("2023-11-16 18:15:46.68,5\n", ":2: expected 3 fields"),
        ("-3,5,2\n", ":2: TIMESTAMP '-3'"),
        ("", "no requests"),
    ],
)
def test_broken_rows_name_the_line(tmp_path, body, expected):
    path = write(tmp_path, body)
    with pytest.raises(HarvestError) as e:
        load_csv(path)
    assert str(path) in str(e.value) and expected in str(e.value)


def test_bad_header_and_missing_file(tmp_path):
    path = tmp_path / "h.csv"
    path.write_text("time,ctx,gen\n1,2,3\n")
    with pytest.raises(HarvestError, match=":1: header must be TIMESTAMP,ContextTokens,GeneratedTokens"):
        load_csv(path)
    with pytest.raises(HarvestError, match="not a file, a shipped trace"):
        load_trace(str(tmp_path / "missing.csv"))


def test_cli_reports_a_broken_trace_in_one_line(tmp_path, harvest_cli):
    path = write(tmp_path, "2023-11-16 18:15:46.68,10,3\n2023-11-16 18:15:47.68,10,-2\n")
    out = subprocess.run(
        [*harvest_cli, "replay", "--trace", str(path), "--simulate", "--out", str(tmp_path / "o")],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and ":3: GeneratedTokens must be >= 1" in out.stderr
    assert "Traceback" not in out.stderr


traces = (
    st.integers(1, 40)
    .flatmap(
        lambda n: st.tuples(
            # Arrival times on a microsecond grid, as trace timestamps are (not subnormal floats that a
            # rate scale would round to zero).
            st.lists(st.integers(0, 10**9).map(lambda us: us / 1e6), min_size=n, max_size=n).map(sorted),
            st.lists(st.integers(0, 5000), min_size=n, max_size=n),
            st.lists(st.integers(1, 800), min_size=n, max_size=n),
        )
    )
    .map(lambda cols: Trace("h", np.array(cols[0]) - cols[0][0], np.array(cols[1]), np.array(cols[2])))
)


@settings(max_examples=60, deadline=None)
@given(traces, st.floats(0, 900), st.floats(1, 900), st.floats(0.05, 20))
def test_window_scale_and_caps_keep_what_they_promise(trace, start, duration, factor):
    inside = (trace.arrival_s >= start) & (trace.arrival_s < start + duration)
    if not inside.any():
        with pytest.raises(HarvestError, match="no request arrives"):
            trace.window(start, duration)
        return
    window = trace.window(start, duration)
    assert window.num_requests == inside.sum()
    np.testing.assert_allclose(window.arrival_s, trace.arrival_s[inside] - start)
    assert window.generated_tokens.tolist() == trace.generated_tokens[inside].tolist()

    scaled = window.scale_rate(factor)
    np.testing.assert_allclose(scaled.arrival_s * factor, window.arrival_s)
    assert scaled.num_generated_tokens == window.num_generated_tokens

    capped = scaled.cap_lengths(100, 7)
    assert capped.num_requests == scaled.num_requests
    assert capped.context_tokens.max() <= 100 and capped.generated_tokens.max() <= 7
    assert np.all(capped.generated_tokens == np.minimum(scaled.generated_tokens, 7))


def test_synthetic_traces_are_seeded_and_hit_their_rate_and_burstiness():
    a = load_trace("poisson:rate=20,duration=500,seed=3")
    b = load_trace("poisson:rate=20,duration=500,seed=3")
    c = load_trace("poisson:rate=20,duration=500,seed=4")
    assert np.array_equal(a.arrival_s, b.arrival_s) and np.array_equal(a.generated_tokens, b.generated_tokens)
    assert not np.array_equal(a.arrival_s[:50], c.arrival_s[:50])
    # 10000 expected arrivals: the count is within 5 sigma (sigma = 100) of rate * duration.
    assert abs(a.num_requests - 10_000) < 500
    gaps = np.diff(a.arrival_s)
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.1

    bursty = load_trace("gamma:rate=20,cv=3,duration=500,seed=3")
    gaps = np.diff(bursty.arrival_s)
    assert 2.4 < gaps.std() / gaps.mean() < 3.6
    assert bursty.arrival_s[-1] < 500
    conv = load_trace("conv")
    assert set(bursty.generated_tokens.tolist()) <= set(conv.generated_tokens.tolist())


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("poisson:rate=5", "needs duration="),
        ("poisson:rate=5,duration=10,cv=2", "poisson trace has cv = 1"),
        ("gamma:rate=-1,duration=10", "rate must be > 0"),
        ("gamma:rate=1,duration=10,burst=2", "'burst=2' is not one of"),
        ("gamma:rate=x,duration=10", "rate='x' is not a number"),
    ],
)
def test_bad_synthetic_specs(spec, expected):
    with pytest.raises(HarvestError, match=expected):
        SyntheticTrace.from_spec(spec)
