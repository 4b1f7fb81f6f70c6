"""The trace simulator: invariants per policy, the acceptance replay of the full conv trace, the plots."""

import json
import subprocess

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from base.errors import HarvestError
from harvest.replay.colocation_policies import POLICY_CLASSES
from harvest.replay.decode_simulator import DecodeSimulator
from harvest.replay.finetune_rates import FinetuneRates
from harvest.replay.replay_config import KNOWN_POLICIES, POLICIES, DeviceMemory, ReplayConfig
from harvest.replay.replay_plots import write_plots
from harvest.replay.replay_simulation import ReplaySimulation
from predictor import Profile
from predictor.finetune_throughput import FinetuneThroughput
from predictor.partition_grid import PartitionGrid
from predictor.sampling_plan import SamplingPlan
from predictor.synthetic_device import SyntheticDevice
from predictor.synthetic_profile import SHIPPED_PATH
from traces.trace import Trace
from traces.trace_loader import load_trace

H100_MEMORY = DeviceMemory.from_name("h100-llama3-8b")


@pytest.fixture(scope="module")
def h100_profile():
    return Profile.load(SHIPPED_PATH)


@pytest.fixture(scope="module")
def cpu_profile():
    grid = PartitionGrid.from_name("cpu")
    device = SyntheticDevice(grid, b0_ms=0.5, c0_ms=30.0, k0_ms=2e-4)
    plan = SamplingPlan(grid, 32, 2048)
    return Profile.build(
        device.measure(plan.fit_points),
        grid,
        device_name="synthetic-cpu",
        model="m",
        finetune_config_id="f",
        samples_path="synthetic",
        finetune_throughput=(FinetuneThroughput(1, 400.0, None, 25.0),),
    )


def small_trace(seed=0, rate=8.0, duration=60.0):
    return load_trace(f"poisson:rate={rate},duration={duration},seed={seed}")


def run_policy(profile, name, trace, config=None, memory=H100_MEMORY):
    config = config or ReplayConfig()
    policy = POLICY_CLASSES[name](profile, memory, FinetuneRates.from_profile(profile), config)
    return DecodeSimulator(policy).run(trace), policy


def check_conservation(run, trace):
    """Every request is admitted after it arrives, finishes after its admission, and decodes exactly its
    GeneratedTokens: the batch sizes of all steps sum to the trace's tokens."""
    assert len(run.finish_s) == trace.num_requests
    assert np.all(run.admit_s >= run.arrival_s - 1e-12)
    assert np.all(run.finish_s > run.admit_s)
    assert int(run.step_batch_size.sum()) == trace.num_generated_tokens
    assert np.all(np.diff(run.step_end_s) > 0)
    assert run.end_s == pytest.approx(run.finish_s.max())


@pytest.mark.parametrize("name", KNOWN_POLICIES)
def test_every_request_completes_and_tokens_are_conserved(h100_profile, name):
    trace = small_trace()
    run, _ = run_policy(h100_profile, name, trace)
    check_conservation(run, trace)
    # The KV in use at a step is what its running requests hold: never above the pool.
    assert run.step_kv_tokens.max() <= H100_MEMORY.kv_capacity_tokens


requests = st.integers(1, 30).flatmap(
    lambda n: st.tuples(
        st.lists(st.floats(0, 5, allow_nan=False), min_size=n, max_size=n).map(sorted),
        st.lists(st.integers(0, 3000), min_size=n, max_size=n),
        st.lists(st.integers(1, 300), min_size=n, max_size=n),
    )
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests, st.sampled_from(KNOWN_POLICIES), st.integers(1, 8), st.integers(5500, 20000))
def test_invariants_hold_on_arbitrary_traces_and_tight_pools(h100_profile, cols, name, max_running, kv_tokens):
    """Tight KV pools and batch caps force queueing; still nothing is lost and no cap is passed. The pool
    is at least 5500 tokens: static's 60 % share of it then holds the longest request (3300 tokens)."""
    arrival, context, generated = (np.array(c) for c in cols)
    trace = Trace("h", arrival - arrival[0], context, generated)
    config = ReplayConfig(max_running_requests=max_running)
    memory = H100_MEMORY.with_kv_capacity(kv_tokens)
    run, policy = run_policy(h100_profile, name, trace, config, memory)
    check_conservation(run, trace)
    assert run.step_batch_size.max() <= max_running
    kv_after = run.step_kv_tokens + run.step_batch_size
    assert kv_after.max() <= policy.kv_capacity_tokens


def test_a_request_longer_than_the_pool_is_an_error_naming_it(h100_profile):
    trace = Trace("t", np.array([0.0, 1.0]), np.array([10, 5000]), np.array([5, 5]))
    with pytest.raises(HarvestError, match="request 1 of t needs 5005 KV tokens but the pool holds 3000"):
        run_policy(h100_profile, "harvest", trace, memory=H100_MEMORY.with_kv_capacity(3000))


def test_simulation_checks_every_pool_before_running(h100_profile):
    """Static keeps 60 % of the pool: a request that fits the whole pool but not static's share fails
    up front, naming the share, before any policy is simulated."""
    trace = Trace("t", np.array([0.0, 1.0]), np.array([10, 2000]), np.array([5, 5]))
    simulation = ReplaySimulation(h100_profile, H100_MEMORY.with_kv_capacity(3000), ReplayConfig())
    with pytest.raises(HarvestError, match=r"request 1 of t needs 2005 KV tokens but the pool holds 1800 \(static"):
        simulation.run(trace)
    only_harvest = ReplaySimulation(
        h100_profile, H100_MEMORY.with_kv_capacity(3000), ReplayConfig(policies=("harvest",))
    )
    assert only_harvest.run(trace)["policies"]["harvest"]["decode"]["num_requests"] == 2


def test_separate_finetunes_at_the_profiles_solo_rate(h100_profile):
    simulation = ReplaySimulation(h100_profile, H100_MEMORY, ReplayConfig(policies=("separate",)))
    results = simulation.run(small_trace())
    whole = next(t for t in h100_profile.finetune_throughput if t.ft_sms == h100_profile.num_sms)
    assert results["policies"]["separate"]["finetune"]["tokens_per_s"] == pytest.approx(
        whole.tokens_per_s_solo, rel=1e-12
    )
    assert results["policies"]["separate"]["finetune"]["decode_device_tokens_per_s"] == 0


@pytest.mark.parametrize("rate", [2.0, 30.0])
def test_harvest_never_exceeds_the_target_when_the_profile_is_exact(h100_profile, rate):
    trace = small_trace(seed=1, rate=rate)
    run, _ = run_policy(h100_profile, "harvest", trace, ReplayConfig(tpot_slo_ms=30.0))
    assert run.step_latency_ms.max() <= 30.0
    assert run.busy_ft_tokens > 0


@pytest.mark.parametrize("noise", [0.05, 0.10])
def test_acceptance_at_reduced_scale_with_noise_harvest_keeps_the_target_and_harvests_most(h100_profile, noise):
    """Issue 12 acceptance, reduced: 10 minutes of conv with the device `noise` off the profile at random
    and no hand-set margin. harvest (the worker's controller and planner) keeps >= 99.9 % of steps within
    the target and trains at least as many tokens as temporal and more than separate, and within 5 % of the
    oracle; temporal, planning on the profile alone, misses the target on more steps than harvest."""
    config = ReplayConfig(latency_noise=noise, policies=("separate", "harvest", "temporal", "oracle"))
    results = ReplaySimulation(h100_profile, H100_MEMORY, config).run(load_trace("conv").window(0, 600))
    p = results["policies"]
    assert p["harvest"]["decode"]["step_slo_attainment"] >= 0.999
    assert p["harvest"]["finetune"]["tokens_per_s"] >= p["temporal"]["finetune"]["tokens_per_s"]
    assert p["harvest"]["finetune"]["tokens_per_s"] > p["separate"]["finetune"]["tokens_per_s"]
    assert p["harvest"]["finetune"]["decode_device_ratio_to_oracle"] >= 0.95
    assert p["temporal"]["decode"]["step_slo_attainment"] < p["harvest"]["decode"]["step_slo_attainment"]


def test_an_explicit_plan_margin_still_overrides_the_learned_one(h100_profile):
    trace = small_trace(seed=2, rate=30.0)
    config = ReplayConfig(tpot_slo_ms=30.0, latency_noise=0.05, plan_margin=0.15)
    policy = POLICY_CLASSES["harvest"](h100_profile, H100_MEMORY, FinetuneRates.from_profile(h100_profile), config)
    run = DecodeSimulator(policy).run(trace)
    assert np.mean(run.step_latency_ms <= 30.0) >= 0.999 and run.busy_ft_tokens > 0
    assert policy.planner.margin_stats()["source"].startswith("fixed")
    assert policy.planner.margin((132, 0)) == policy.planner.margin((64, 64)) == pytest.approx(1 / 0.85)


def test_one_partition_profile_static_is_not_applicable_and_harvest_shares_time(cpu_profile):
    memory = DeviceMemory.from_name("cpu-smollm2-135m")
    config = ReplayConfig(tpot_slo_ms=200.0)
    trace = small_trace(seed=0, rate=1.0, duration=30).cap_lengths(1000, 20)
    results = ReplaySimulation(cpu_profile, memory, config).run(trace)
    static = results["policies"]["static"]
    assert static["status"] == "not_applicable" and "one partition" in static["reason"]
    harvest = results["policies"]["harvest"]
    assert harvest["status"] == "ok" and harvest["decode"]["num_tokens"] == trace.num_generated_tokens
    assert harvest["finetune"]["decode_device_tokens_per_s"] > 0
    assert harvest["co_run_step_fraction"] == 0
    assert any("one partition" in note for note in results["notes"])
    assert results["policies"]["separate"]["finetune"]["tokens_per_s"] == pytest.approx(400.0)


@pytest.mark.parametrize(("rate", "tolerance"), [(0.5, 0.001), (0.7, 0.01)])
def test_on_a_loaded_cpu_host_harvest_keeps_the_steps_decode_alone_keeps(rate, tolerance):
    """The shipped core profile's decode, busy ~60 % (rate 0.5) and ~80 % (0.7) of the time under Poisson
    arrivals (64-token replies, a 300 ms target, the device 10 % noisy). Slices stretch steps and so grow the
    batch toward what decode alone serves, and the batch's random spread then carries it past. Over four seeds
    harvest keeps its steps within `tolerance` of the share decode alone keeps (at 0.7 decode alone itself
    misses up to 9 %), and still trains on the decode device."""
    profile = Profile.load(SHIPPED_PATH.parent / "cpu-cores-smollm2-135m.json")
    config = ReplayConfig(tpot_slo_ms=300.0, latency_noise=0.1, policies=("separate", "harvest"))
    for seed in range(4):
        trace = load_trace(f"poisson:rate={rate},duration=1200,seed={seed}").cap_lengths(512, 64)
        results = ReplaySimulation(profile, DeviceMemory.for_profile(profile), config).run(trace)
        separate, harvest = (results["policies"][name] for name in ("separate", "harvest"))
        kept = harvest["decode"]["step_slo_attainment"]
        assert kept >= separate["decode"]["step_slo_attainment"] - tolerance, seed
        assert harvest["finetune"]["decode_device_tokens_per_s"] > 0


@pytest.fixture(scope="module")
def conv_results(h100_profile):
    config = ReplayConfig(latency_noise=0.05)
    return ReplaySimulation(h100_profile, H100_MEMORY, config, str(SHIPPED_PATH)).run(load_trace("conv"))


def test_acceptance_full_conv_trace_harvest_keeps_999_per_mille_and_reports_ratios(conv_results):
    """Issue 7 acceptance, on the shipped SYNTHETIC profile (the results say so), with the device 5 % off it."""
    assert conv_results["profile"]["is_synthetic"]
    assert conv_results["trace"]["num_requests"] == load_trace("conv").num_requests
    harvest = conv_results["policies"]["harvest"]
    assert harvest["decode"]["step_slo_attainment"] >= 0.999
    policies = conv_results["policies"]
    for baseline in ("separate", "static"):
        expected = harvest["finetune"]["tokens_per_s"] / policies[baseline]["finetune"]["tokens_per_s"]
        assert harvest["finetune"][f"ratio_to_{baseline}"] == pytest.approx(expected, rel=1e-3)
    assert harvest["finetune"]["ratio_to_separate"] > 1 and harvest["finetune"]["ratio_to_static"] > 1
    assert harvest["finetune"]["tokens_per_s"] >= policies["temporal"]["finetune"]["tokens_per_s"]
    for entry in conv_results["policies"].values():
        assert entry["decode"]["num_tokens"] == load_trace("conv").num_generated_tokens
    assert conv_results["policies"]["static"]["split"] == {"infer_sms": 80, "ft_sms": 48}


def test_plots_are_written_and_not_blank(conv_results, tmp_path):
    import matplotlib.image

    paths = write_plots(conv_results, tmp_path)
    assert sorted(p.name for p in paths) == [
        "finetune_throughput.png",
        "memory_window.png",
        "sm_split_latency.png",
        "tpot_cdf.png",
    ]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        pixels = matplotlib.image.imread(path)
        assert pixels.std() > 0.05, f"{path.name} is blank"


def test_cli_simulate_writes_results_with_every_field(tmp_path, harvest_cli):
    out = tmp_path / "sim"
    proc = subprocess.run(
        [
            *harvest_cli,
            "replay",
            "--trace",
            "conv",
            "--window",
            "60s",
            "--rate-scale",
            "2",
            "--simulate",
            "--with-oracle",
            "--out",
            str(out),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["mode"] == "simulated" and results["trace"]["rate_scale"] == 2
    assert set(results["policies"]) == {*POLICIES, "oracle"}
    for entry in results["policies"].values():
        assert entry["finetune"]["decode_device_ratio_to_oracle"] is not None
        assert {"decode", "finetune", "series", "tpot_cdf_ms", "step_latency_cdf_ms"} <= set(entry)
        assert {"step_slo_attainment", "tpot_ms_p50", "tpot_ms_p90", "tpot_ms_p99"} <= set(entry["decode"])
        assert {"tokens_per_s", "samples_per_s", "ratio_to_separate"} <= set(entry["finetune"])
        assert "lent_bytes" in entry["series"]
    assert "SYNTHETIC" in proc.stdout and "harvest" in proc.stdout
    assert (out / "tpot_cdf.png").stat().st_size > 0


def test_every_memory_preset_says_what_was_measured_and_what_guessed():
    from harvest.replay.replay_config import MEMORY_PRESETS

    for preset in MEMORY_PRESETS.values():
        assert "guessed" in preset.basis, preset.name
    assert preset.with_kv_capacity(1024).basis.startswith(preset.basis)


@pytest.mark.parametrize(("profile_name", "preset"), [
    ("cpu-cores-smollm2-135m.json", "cpu-smollm2-135m"),  # core partitions: num_sms is the host's cores
    ("cpu-smollm2-135m.json", "cpu-smollm2-135m"),
    ("synthetic-h100-llama3-8b.json", "h100-llama3-8b"),
])
def test_the_default_memory_preset_follows_the_profiles_device_kind(profile_name, preset):
    profile = Profile.load(SHIPPED_PATH.parent / profile_name)
    assert DeviceMemory.for_profile(profile).name == preset
    assert DeviceMemory.for_profile(profile, "h100-llama3-8b").name == "h100-llama3-8b"
