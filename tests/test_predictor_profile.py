"""Profile JSON: round trip, optional finetune-throughput section, and explained validation errors."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from base.errors import HarvestError
from predictor.finetune_throughput import FinetuneThroughput
from predictor.partition_grid import PartitionGrid
from predictor.profile import Profile
from predictor.samples import write_samples
from predictor.sampling_plan import SamplingPlan
from predictor.synthetic_device import SyntheticDevice


@pytest.fixture(scope="module")
def h100_profile(tmp_path_factory) -> Profile:
    grid = PartitionGrid.from_name("h100")
    device = SyntheticDevice(grid)
    plan = SamplingPlan(grid, 128, 2048)
    path = tmp_path_factory.mktemp("p") / "fit.csv"
    samples = device.measure(plan.fit_points)
    write_samples(path, samples)
    return Profile.build(
        samples,
        grid,
        device_name="NVIDIA H100 80GB HBM3",
        model="llama3-8b",
        finetune_config_id="lora-r8",
        samples_path=path,
        held_out=device.measure(plan.held_out_points, 1),
        finetune_throughput=(FinetuneThroughput(64, 2000.0, 1500.0, 9.5), FinetuneThroughput(8, 300.0, 250.0, 11.0)),
    )


def test_save_load_round_trip(tmp_path, h100_profile):
    path = tmp_path / "p.json"
    h100_profile.save(path)
    loaded = Profile.load(path)
    assert loaded == h100_profile
    data = json.loads(path.read_text())
    assert data["schema_version"] == Profile.SCHEMA_VERSION
    assert data["device"] == {"name": "NVIDIA H100 80GB HBM3", "num_sms": 132, "sm_granularity": 8}
    assert len(data["samples"]["sha256"]) == 64
    assert [132, 0] in data["partitions"] and [64, 64] in data["partitions"]
    assert {c["form"] for c in data["latency_model"]["colo"]["candidates"]} >= {"eq3_as_printed", "eq5_bandwidth"}
    assert data["fit_metrics"]["held_out"]["colo"]["n"] > 0


def test_cpu_profile_without_colo_or_throughput_round_trips(tmp_path):
    grid = PartitionGrid.from_name("cpu")
    device = SyntheticDevice(grid, c0_ms=40.0, b0_ms=1.0, k0_ms=1e-3)
    samples = device.measure(SamplingPlan(grid, 8, 256).fit_points)
    profile = Profile.build(samples, grid, device_name="cpu", model="tiny", finetune_config_id="t", samples_path="x")
    profile.save(tmp_path / "p.json")
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["latency_model"]["colo"] is None and data["finetune_throughput"] is None
    assert data["partitions"] == [[1, 0]]
    assert Profile.load(tmp_path / "p.json") == profile


def test_cpu_finetune_rate_round_trips_and_feeds_the_simulator(tmp_path):
    """Pins what `harvest profile --finetune` writes on a CPU: one whole-device entry, solo only, with
    samples/s; FinetuneRates reads it, and profiles written before samples/s existed still load."""
    from harvest.replay.finetune_rates import FinetuneRates

    grid = PartitionGrid.from_name("cpu")
    samples = SyntheticDevice(grid, c0_ms=40.0, b0_ms=1.0, k0_ms=1e-3).measure(SamplingPlan(grid, 8, 256).fit_points)
    rate = FinetuneThroughput(1, 120.0, None, 35.0, samples_per_s_solo=1.5)
    profile = Profile.build(samples, grid, device_name="cpu", model="tiny", finetune_config_id="t", samples_path="x",
                            finetune_throughput=(rate,))
    profile.save(tmp_path / "p.json")
    assert Profile.load(tmp_path / "p.json").finetune_throughput == (rate,)
    rates = FinetuneRates.from_profile(profile)
    assert rates.whole_device_tokens_per_s == 120.0 and rates.unit_ms == 35.0 and rates.colo_tokens_per_s is None
    data = json.loads((tmp_path / "p.json").read_text())
    del data["finetune_throughput"][0]["samples_per_s_solo"]
    (tmp_path / "old.json").write_text(json.dumps(data))
    assert Profile.load(tmp_path / "old.json").finetune_throughput[0].samples_per_s_solo is None


def test_a_measured_co_run_profile_feeds_the_simulator_its_co_run_rates():
    """Pins a defect: `harvest profile --co-run` writes co-run rates per finetune partition and, for the whole
    device, only the solo rate (nothing decodes beside it); the simulator read co-run rates only when every
    entry had one, so `harvest replay --simulate` on a measured co-run profile refused every co-run pair."""
    from harvest.replay.finetune_rates import FinetuneRates

    profile = Profile.load("predictor/profiles/cpu-cores-smollm2-135m.json")
    (co_run, whole) = profile.finetune_throughput
    assert (co_run.ft_sms, whole.ft_sms, whole.tokens_per_s_colo) == (1, 2, None)
    rates = FinetuneRates.from_profile(profile)
    assert rates.colo(1) == co_run.tokens_per_s_colo and rates.colo(2) == co_run.tokens_per_s_colo   # flat past it
    assert rates.colo(0) == 0.0 and rates.whole_device_tokens_per_s == whole.tokens_per_s_solo


def corrupt(profile: Profile, tmp_path, edit) -> str:
    data = profile.to_dict()
    edit(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(HarvestError) as e:
        Profile.load(path)
    assert str(path) in str(e.value)
    return str(e.value)


def test_invalid_profiles_are_explained(tmp_path, h100_profile):
    def set_(path, value):
        def edit(data):
            *parents, last = path
            for key in parents:
                data = data[key]
            data[last] = value

        return edit

    assert "schema_version is 99" in corrupt(h100_profile, tmp_path, set_(["schema_version"], 99))
    assert "device.num_sms must be an integer" in corrupt(h100_profile, tmp_path, set_(["device", "num_sms"], "132"))
    assert "latency_model.solo.partitions[0].k0_ms must be a finite number" in corrupt(
        h100_profile, tmp_path, set_(["latency_model", "solo", "partitions", 0, "k0_ms"], None)
    )
    assert "must be >= 0" in corrupt(
        h100_profile, tmp_path, set_(["latency_model", "solo", "partitions", 0, "b0_ms"], -1.0)
    )
    assert "form must be one of" in corrupt(h100_profile, tmp_path, set_(["latency_model", "colo", "form"], "eq9"))
    assert "model is missing" in corrupt(h100_profile, tmp_path, lambda d: d.pop("model"))
    assert "partitions do not match" in corrupt(h100_profile, tmp_path, set_(["partitions"], [[132, 0]]))
    assert "finetune_throughput[0]" in corrupt(h100_profile, tmp_path, set_(["finetune_throughput", 0, "unit_ms"], 0))
    assert "exceeds the device's 132" in corrupt(
        h100_profile, tmp_path, set_(["finetune_throughput", 0, "ft_sms"], 256)
    )
    assert "is not a partition" in corrupt(
        h100_profile, tmp_path, set_(["latency_model", "solo", "partitions", 0, "infer_sms"], 13)
    )


def test_unreadable_files_are_explained(tmp_path):
    with pytest.raises(HarvestError, match="cannot read profile"):
        Profile.load(tmp_path / "missing.json")
    (tmp_path / "p.json").write_text("{not json")
    with pytest.raises(HarvestError, match=r"not valid JSON \(line 1"):
        Profile.load(tmp_path / "p.json")
    (tmp_path / "p.json").write_text("[]")
    with pytest.raises(HarvestError, match="top level must be a JSON object"):
        Profile.load(tmp_path / "p.json")


def paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from paths(value, (*prefix, key))
    elif isinstance(obj, list):
        for n, value in enumerate(obj[:3]):
            yield from paths(value, (*prefix, n))


junk = st.sampled_from([None, "x", "", -1, 0, 10**12, 1.5, -1e9, float("inf"), True, [], {}, [1, 2], {"a": 1}])


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_any_single_corruption_loads_or_raises_harvest_error(h100_profile, data):
    """Pins that no corrupt profile escapes as a TypeError/KeyError/ValueError or hangs."""
    original = h100_profile.to_dict()
    path = data.draw(st.sampled_from([p for p in paths(original) if p]))
    value = data.draw(junk)
    corrupted = json.loads(json.dumps(original))
    target = corrupted
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    try:
        Profile.from_dict(json.loads(json.dumps(corrupted, allow_nan=True)), "p.json")
    except HarvestError as e:
        assert str(e).startswith("p.json")
