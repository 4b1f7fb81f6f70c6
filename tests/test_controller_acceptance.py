"""Controller acceptance, deterministic: the worker's own controllers (temporal, and the spatial one as the
simulator runs it) and SplitPlanner on a simulated clock, the device's decode step times and finetune unit
times replayed from what real workers on this CPU host measured (eval/recordings/README.md: a quiet host
with a 1.9 s stall, a loaded host where decode alone misses the target, each unit kind's first-time
warm-up of 187-214 ms against a p50 of 1.4-22 ms, a 1.46 s unit stall in the job's second optimizer step).
No SGLang worker and no wall clock: the numbers are the same on every run and host (eval/README.md,
"Controller acceptance on a recorded host", has them, and with each defect below).

Pins what the live e2e SLO test judged, and fails with either known defect put back: the warm-up counted
in a kind's estimate (reverted e0d9583: embed priced at ~10^6 ms, the job waits for idle turns) and the
slice without room for the batch's spread (reverted 4176e36: slices grow batches past what decode alone
serves, so steps miss that decode alone would have met)."""

from pathlib import Path

import numpy as np
import pytest

from harvest.replay.colocation_policies import POLICY_CLASSES
from harvest.replay.decode_simulator import DecodeSimulator
from harvest.replay.finetune_rates import FinetuneRates
from harvest.replay.recorded_device import RecordedDecodeNoise, RecordedJob, Recording
from harvest.replay.replay_config import DeviceMemory, ReplayConfig
from harvest.replay.simulated_job import SimClock, SimulatedUnit
from predictor import Profile
from traces.trace import Trace
from traces.trace_loader import load_trace

ROOT = Path(__file__).resolve().parents[1]
RECORDING = ROOT / "eval" / "recordings" / "cpu-smollm2-135m.json.gz"
TPOT_SLO_MS = 500.0
ATTAINMENT_TOLERANCE = 0.01
"""harvest keeps within a point of decode alone's share of steps within the target on the same recorded host
(current code: 0.74 and 0.12 points under, the unit stall's slice and the batches it held up included; the
batch-spread bound reverted: 1.18 and 2.01)."""
MAX_JOB_MISS_FRACTION = 0.001
"""Steps over the target whose decode alone was within it (the slice or an idle unit's wait made them miss):
at most the 0.1 % harvest aims at (current code: 1 of ~2000, the slice the 1.46 s unit stall ran in)."""

# (profile, mode, fewest finetune units run in slices): today 612 and 497; with the warm-up counted the job
# waits for idle turns and runs 427 and 424.
CASES = [
    ("cpu-smollm2-135m", "temporal", 520),
    ("cpu-cores-smollm2-135m", "spatial", 460),
]


@pytest.fixture(scope="module")
def recording():
    return Recording.load(RECORDING)


def busy_trace() -> Trace:
    """400 s of Poisson arrivals at 0.25/s, the first at 0: the job starts on a busy worker, with no idle time
    to warm its unit kinds up in."""
    trace = load_trace("poisson:rate=0.25,duration=400,seed=2").cap_lengths(512, 64)
    return Trace(trace.name, trace.arrival_s - trace.arrival_s[0], trace.context_tokens, trace.generated_tokens)


def simulate(profile, name, trace, recording):
    config = ReplayConfig(tpot_slo_ms=TPOT_SLO_MS, policies=(name,))
    policy = POLICY_CLASSES[name](profile, DeviceMemory.for_profile(profile), FinetuneRates.from_profile(profile),
                                  config, recording)
    return DecodeSimulator(policy).run(trace), policy


def test_the_recording_holds_the_outliers_the_live_test_met(recording):
    """The recorded device carries what broke the live runs: a decode step over 1 s (a host stall), a unit
    over 1 s, and each kind's first unit many times its median (the warm-up)."""
    assert max(ms for _, _, ms in recording.decode_steps) > 1000
    assert max(u.duration_ms for u in recording.units) > 1000
    first = {}
    for u in recording.units:
        first.setdefault(u.kind, u.duration_ms)
    embed = sorted(u.duration_ms for u in recording.units if u.kind == "embed")
    assert first["embed"] > 100 * embed[len(embed) // 2]


@pytest.mark.parametrize("profile_name, mode, min_slice_units", CASES)
def test_harvest_keeps_decode_alones_attainment_on_a_recorded_host(recording, profile_name, mode, min_slice_units):
    profile = Profile.load(ROOT / "predictor" / "profiles" / f"{profile_name}.json")
    trace = busy_trace()
    alone, _ = simulate(profile, "separate", trace, recording)
    run, policy = simulate(profile, "harvest", trace, recording)
    controller = policy.controller
    assert controller.mode == mode

    alone_within = float(np.mean(alone.step_latency_ms <= TPOT_SLO_MS))
    within = float(np.mean(run.step_latency_ms <= TPOT_SLO_MS))
    missed = run.step_latency_ms > TPOT_SLO_MS
    by_job = missed & (run.step_decode_ms <= TPOT_SLO_MS)
    slice_s = controller.finetune_ms_in_slack / 1e3
    numbers = (f"{mode}: {within:.4%} of {len(missed)} steps within {TPOT_SLO_MS} ms against decode alone's "
               f"{alone_within:.4%}; misses {int(missed.sum())}, {int(by_job.sum())} of them by the job "
               f"(steps {np.flatnonzero(by_job).tolist()[:10]}); {controller.num_units_in_slack} units in "
               f"slices ({slice_s:.1f} s), {controller.num_units_idle} in idle turns, "
               f"{run.ft_tokens:.0f} tokens; admitted at (ms): "
               f"{ {kind: t['admit_ms'] for kind, t in controller.unit_time_stats().items()} }")
    assert alone_within < 0.99, "the recording's loaded host must make decode alone miss: " + numbers
    assert within >= alone_within - ATTAINMENT_TOLERANCE, numbers
    assert by_job.sum() <= MAX_JOB_MISS_FRACTION * len(missed), numbers
    assert controller.num_units_in_slack >= min_slice_units, numbers
    longest = max(range(len(recording.units)), key=lambda i: recording.units[i].duration_ms)
    assert policy.job.num_units_run > longest, "the job must reach the recorded unit stall: " + numbers
    assert run.ft_tokens > 0, numbers


def test_the_same_numbers_every_run(recording):
    """Nothing in the simulation reads the wall clock or an unseeded random draw."""
    profile = Profile.load(ROOT / "predictor" / "profiles" / "cpu-smollm2-135m.json")
    trace = load_trace("poisson:rate=0.25,duration=60,seed=2")
    first, second = (simulate(profile, "harvest", trace, recording)[0] for _ in range(2))
    assert np.array_equal(first.step_latency_ms, second.step_latency_ms)
    assert first.ft_tokens == second.ft_tokens


def test_a_recorded_job_replays_units_in_order_and_each_warm_up_once():
    """Wrapping past the end replays the units after every kind's first: a process warms a kind up once."""
    units = tuple(SimulatedUnit(k, ms, 0.0) for k, ms in [("a", 100.0), ("b", 50.0), ("a", 1.0), ("b", 2.0)])
    job = RecordedJob(SimClock(), Recording("r", ((1, 1, 1.0),), units, 10.0))
    times = [job.run_unit().duration_ms for _ in range(6)]
    assert times == [100.0, 50.0, 1.0, 2.0, 1.0, 2.0]
    assert job.clock() == pytest.approx(0.156)


def test_recorded_decode_follows_the_hosts_timeline():
    """A step takes the ratio of the recorded step running when it starts, the recording laid end to end and
    cycling; the ratio is to the profile's prediction at the recorded step's own shape."""
    profile = Profile.load(ROOT / "predictor" / "profiles" / "cpu-smollm2-135m.json")
    steps = ((1, 100, 100.0), (4, 800, 300.0))
    noise = RecordedDecodeNoise(Recording("r", steps, (SimulatedUnit("a", 1.0, 0.0),), 10.0),
                                profile.latency_model, 1)
    first, second = (ms / profile.latency_model.predict_solo_ms(1, b, kv / b) for b, kv, ms in steps)
    assert [noise.at(t) for t in (0.0, 0.099, 0.1, 0.399, 0.45)] == [first, first, second, second, first]
