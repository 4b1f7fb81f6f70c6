"""`harvest replay --simulate --jobs`: a job-arrival trace driven through the JobSet by the harvest policy's
own controller on the simulated request trace (pure simulation: no worker, fast)."""

import functools
import json

import pytest

from base.errors import HarvestError
from harvest.cli.main import main
from harvest.replay.colocation_policies import HarvestPolicy
from harvest.replay.decode_simulator import DecodeSimulator
from harvest.replay.finetune_rates import FinetuneRates
from harvest.replay.job_replay import JobReplay
from harvest.replay.job_trace import (
    JobArrival,
    SyntheticJobs,
    load_job_trace,
    load_jobs,
)
from harvest.replay.replay_config import DeviceMemory, ReplayConfig
from harvest.replay.replay_simulation import ReplaySimulation
from harvest.replay.simulated_job_set import JOB_POLICIES, SimulatedJobSet
from predictor import Profile
from predictor.synthetic_profile import SHIPPED_PATH
from traces.trace_loader import load_trace

MEMORY = DeviceMemory.from_name("h100-llama3-8b")
TRACE = "poisson:rate=8,duration=120,seed=0"


@pytest.fixture(scope="module")
def simulation():
    return ReplaySimulation(Profile.load(SHIPPED_PATH), MEMORY, ReplayConfig(policies=("harvest",)))


@pytest.fixture(scope="module")
def trace():
    return load_trace(TRACE)


def run_jobs(simulation, trace, source, harvest_tokens_per_s=2000.0) -> dict:
    return JobReplay(source, "test").run(simulation, trace, harvest_tokens_per_s)


def test_scheduler_meets_a_deadline_fifo_misses_behind_a_long_job(simulation, trace):
    """A long job without deadline arrives first, a short one with a tight deadline right after: FIFO (and
    one-at-a-time) make it wait behind the long one, the scheduler runs it first."""
    arrivals = [JobArrival(0.0, "long", 100_000.0), JobArrival(1.0, "short", 5000.0, deadline_s=15.0)]
    rows = run_jobs(simulation, trace, arrivals)["policies"]
    assert [rows[p]["num_deadlines_met"] for p in JOB_POLICIES] == [1, 0, 0]
    assert all(rows[p]["num_jobs_finished"] == 2 for p in JOB_POLICIES)


def test_scheduler_meets_at_least_fifos_deadlines_on_a_mixed_trace_and_tokens_are_reported(simulation, trace):
    jobs = run_jobs(simulation, trace, SyntheticJobs(16, load=0.9, seed=3))
    rows = jobs["policies"]
    assert jobs["num_with_deadline"] > 0 and set(rows) == set(JOB_POLICIES)
    assert rows["slack"]["num_deadlines_met"] >= rows["fifo"]["num_deadlines_met"]
    assert rows["slack"]["num_deadlines_met"] > rows["one-at-a-time"]["num_deadlines_met"]
    for row in rows.values():
        assert 0 < row["tokens_trained"] <= row["tokens_trained_total"] <= jobs["total_tokens"]
        assert 0 < row["step_slo_attainment"] <= 1
    # The restart after each job is harvest one-at-a-time loses while it serves the same requests.
    assert rows["one-at-a-time"]["tokens_trained"] < rows["fifo"]["tokens_trained"]


def test_the_set_is_credited_every_token_the_device_trained(simulation, trace):
    """Pins co-run accounting: what the finetune partition trains beside a decode step goes to the active job
    (through JobSet.run_unit, as the unit thread's units do), so the jobs' tokens are the device's."""
    arrivals = SyntheticJobs(8, load=2.0, seed=1).generate(2000.0, trace.duration_s)
    make_job = functools.partial(SimulatedJobSet, arrivals=arrivals, policy="slack", prior_tokens_per_s=2000.0)
    policy = HarvestPolicy(simulation.profile, MEMORY, FinetuneRates.from_profile(simulation.profile),
                           simulation.config, make_job=make_job)
    policy.planner.switch_ms = 0.0  # co-run steps (the shipped profile's co-runs do not pay for the switch)
    run = DecodeSimulator(policy).run(trace)
    trained = sum(m.num_trained_tokens for m in policy.job.members.values())
    assert run.busy_ft_tokens > 0 and (run.step_ft_sms > 0).any()
    assert trained == pytest.approx(run.busy_ft_tokens + run.idle_ft_tokens, rel=1e-9)


@pytest.mark.parametrize("line, problem", [
    ('{"arrival_s": 1, "name": "b", "total_tokens": 10', "not JSON"),
    ('{"arrival_s": 1, "name": "b", "size": 3}', "unknown key 'size'"),
    ('{"arrival_s": 1, "name": "b", "total_tokens": -5}', "total_tokens: -5 must be > 0"),
    ('{"arrival_s": 9, "name": "b", "total_tokens": 5, "deadline_s": 4}', "deadline_s: 4 is not after arrival_s 9"),
    ('{"arrival_s": 1, "name": "a", "total_tokens": 5}', "name: 'a' is already line 1's"),
    ('{"arrival_s": "soon", "name": "b", "total_tokens": 5}', "arrival_s: 'soon' is not a number"),
])
def test_a_bad_job_trace_line_is_refused_naming_file_and_line(tmp_path, capsys, line, problem):
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"arrival_s": 0, "name": "a", "total_tokens": 10}\n' + line + "\n")
    out = tmp_path / "out"
    code = main(["replay", "--trace", TRACE, "--simulate", "--no-plots", "--out", str(out), "--jobs", str(jobs)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"harvest replay: error: {jobs}:2: {problem}")
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists()  # refused before anything ran


@pytest.mark.parametrize("argv, message", [
    (["--jobs", "synthetic:0"], "N >= 1"),
    (["--jobs", "synthetic:5,bogus=1"], "'bogus=1' is not N, load= or seed="),
    (["--jobs", "synthetic:5", "--policy", "separate"], "give --policy harvest or all"),
    (["--jobs", "synthetic:5", "--job-restart-s", "-1"], "--job-restart-s -1.0 must be >= 0"),
    (["--jobs", "no-such-file.jsonl"], "cannot read job trace no-such-file.jsonl"),
])
def test_bad_jobs_flags_are_one_line_errors(tmp_path, capsys, argv, message):
    code = main(["replay", "--trace", TRACE, "--simulate", "--no-plots", "--out", str(tmp_path / "o"), *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1


def test_results_json_holds_the_jobs_section_and_the_trace_used(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["replay", "--trace", "poisson:rate=4,duration=60,seed=0", "--simulate", "--policy", "harvest",
                 "--no-plots", "--out", str(out), "--jobs", "synthetic:6,load=0.8,seed=2"]) == 0
    results = json.loads((out / "results.json").read_text())
    jobs = results["jobs"]
    assert set(jobs["policies"]) == set(JOB_POLICIES) and jobs["num_jobs"] == 6
    assert jobs["harvest_tokens_per_s"] == pytest.approx(
        results["policies"]["harvest"]["finetune"]["decode_device_tokens_per_s"], rel=1e-3)
    for row in jobs["policies"].values():
        assert {"num_deadlines_met", "num_with_deadline", "tokens_trained", "step_slo_attainment"} <= set(row)
    assert [vars_of(a) for a in load_job_trace(out / "job_trace.jsonl")] == jobs["arrivals"]
    assert "deadlines met" in capsys.readouterr().out


def vars_of(arrival: JobArrival) -> dict:
    return {k: getattr(arrival, k) for k in arrival.__slots__}


def test_synthetic_spec_parses_and_draws_deterministically():
    spec = load_jobs("synthetic:12,load=0.9,seed=4")
    assert spec == SyntheticJobs(12, 0.9, 4)
    arrivals = spec.generate(500.0, 600.0)
    assert arrivals == spec.generate(500.0, 600.0) and len(arrivals) == 12
    assert all(a.deadline_s is None or a.deadline_s > a.arrival_s for a in arrivals)
    with pytest.raises(HarvestError, match="not a number"):
        load_jobs("synthetic:12,load=high")


def test_jobs_on_a_trace_with_no_harvest_are_refused(simulation, trace):
    with pytest.raises(HarvestError, match="^--jobs: the harvest policy trained 0 tokens/s"):
        run_jobs(simulation, trace, SyntheticJobs(4), harvest_tokens_per_s=0.0)


def test_a_one_partition_profile_runs_the_jobs_in_temporal_slices():
    """No co-run model: the temporal controller drives the set, its units in the slices and idle loops only."""
    from predictor.finetune_throughput import FinetuneThroughput
    from predictor.partition_grid import PartitionGrid
    from predictor.sampling_plan import SamplingPlan
    from predictor.synthetic_device import SyntheticDevice

    grid = PartitionGrid.from_name("cpu")
    device = SyntheticDevice(grid, b0_ms=0.5, c0_ms=30.0, k0_ms=2e-4)
    profile = Profile.build(device.measure(SamplingPlan(grid, 32, 2048).fit_points), grid,
                            device_name="synthetic-cpu", model="m", finetune_config_id="f", samples_path="synthetic",
                            finetune_throughput=(FinetuneThroughput(1, 400.0, None, 25.0),))
    simulation = ReplaySimulation(profile, DeviceMemory.from_name("cpu-smollm2-135m"),
                                  ReplayConfig(policies=("harvest",), tpot_slo_ms=100.0))
    trace = load_trace("poisson:rate=2,duration=120,seed=0").cap_lengths(512, 64)
    rows = run_jobs(simulation, trace, SyntheticJobs(10, 0.9, 2), harvest_tokens_per_s=230.0)["policies"]
    assert all(row["num_jobs_finished"] == 10 and row["tokens_trained"] > 0 for row in rows.values())
    assert rows["one-at-a-time"]["makespan_s"] > rows["fifo"]["makespan_s"]  # the restarts between jobs
