"""The job set's pieces without a worker: the spec check, the durable store, and the scheduling policy on
replay's simulated clock and jobs (deterministic: units take fixed simulated time)."""

import json
from itertools import pairwise

import pytest

from base.errors import HarvestError
from harvest.colocation.finetune_job import FinetuneState
from harvest.jobs import JobSet, JobSpec, JobStore
from harvest.jobs.job_set import DeadlineError
from harvest.jobs.job_store import JobRecord
from harvest.replay.simulated_job import SimClock, SimulatedJob

YAML = "lora_rank: 8\nmax_steps: 10\n"


def spec(name, total_tokens=1000.0, **kw) -> JobSpec:
    return JobSpec(name=name, total_tokens=total_tokens, **{"yaml_text": YAML, **kw})


def sim_job(clock, unit_ms=100.0, tokens_per_s=1000.0) -> SimulatedJob:
    job = SimulatedJob(clock, unit_ms, tokens_per_s)  # 100 tokens per 100 ms unit
    job.is_ready = True
    return job


def run(job_set: JobSet, num_units: int) -> list[str]:
    """The controller's loop reduced to its job calls: whose unit ran, unit by unit."""
    ran = []
    for _ in range(num_units):
        job_set.poll()
        if not job_set.has_ready_work():
            break
        job_set.next_unit_kind()
        job_set.run_unit()
        ran.append(job_set.active_name)
    return ran


# ---- spec ----

@pytest.mark.parametrize("kw, key", [
    ({"name": "Bad Name"}, "name"),
    ({"name": "a/../b"}, "name"),
    ({"name": "x" * 64}, "name"),
    ({"publish_name": "has space"}, "publish_name"),
    ({"total_tokens": 0}, "total_tokens"),
    ({"deadline_s": 5.0, "submitted_s": 10.0}, "deadline_s"),
    ({"yaml_text": "k: v\n" * 20000}, "yaml"),
])
def test_bad_spec_names_its_key(kw, key):
    with pytest.raises(HarvestError, match=f"^{key}: "):
        JobSpec(**{"name": "ok", "yaml_text": YAML, "total_tokens": 1.0, **kw})


def test_yaml_syntax_error_names_the_line():
    with pytest.raises(HarvestError, match="^yaml: not valid YAML at line 2"):
        spec("a", yaml_text="lora_rank: 8\nmax_steps: : 2\n").parsed_yaml()
    with pytest.raises(HarvestError, match="^yaml: must be a mapping"):
        spec("a", yaml_text="- 1\n").parsed_yaml()


# ---- store ----

def test_store_round_trip_and_restart(tmp_path):
    store = JobStore(tmp_path)
    store.add(JobRecord(spec("b", priority=2, submitted_s=2.0)))
    store.add(JobRecord(spec("a", deadline_s=100.0, submitted_s=1.0)))
    store.update("b", state="paused", checkpoint_dir="/ckpt/b", num_trained_tokens=40.0)
    reopened = JobStore(tmp_path).load()  # what a restarted worker reads
    assert [r.spec.name for r in reopened] == ["a", "b"]
    assert reopened[1] == JobRecord(spec("b", priority=2, submitted_s=2.0), "paused", "/ckpt/b", 40.0)
    assert reopened[0].spec.deadline_s == 100.0
    assert not list(tmp_path.glob(".tmp-*"))


def test_store_refuses_duplicate_and_too_many(tmp_path, monkeypatch):
    store = JobStore(tmp_path)
    store.add(JobRecord(spec("a")))
    with pytest.raises(HarvestError, match="^name: a job named 'a' already exists"):
        store.add(JobRecord(spec("a", priority=5)))
    assert store.get("a").spec.priority == 0
    monkeypatch.setattr(JobStore, "MAX_JOBS", 2)
    store.add(JobRecord(spec("b")))
    with pytest.raises(HarvestError, match="holds 2 jobs"):
        store.add(JobRecord(spec("c")))
    assert not store.path("c").exists()


def test_store_write_is_atomic(tmp_path, monkeypatch):
    """A write that dies mid-way (forced: json.dump raises) leaves the old record whole and no temp file."""
    store = JobStore(tmp_path)
    store.add(JobRecord(spec("a")))

    def broken_dump(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(json, "dump", broken_dump)
    with pytest.raises(OSError):
        store.update("a", state="running")
    monkeypatch.undo()
    assert store.get("a").state == "queued"
    assert not list(tmp_path.glob(".tmp-*"))


# ---- policy ----

def test_least_slack_runs_first_then_the_other():
    clock = SimClock()
    job_set = JobSet(clock, prior_tokens_per_s=1000.0)
    job_set.submit(spec("loose", deadline_s=100.0), sim_job(clock))
    job_set.submit(spec("tight", deadline_s=3.0), sim_job(clock))
    ran = run(job_set, 20)
    assert ran == ["tight"] * 10 + ["loose"] * 10
    assert job_set.job_state(job_set.members["tight"]) == "finished"
    assert job_set.members["tight"].finished_s <= 3.0


def test_priority_then_fair_share_without_deadlines():
    clock = SimClock()
    job_set = JobSet(clock, fair_share_quantum_ms=200.0)  # two 100 ms units a turn
    job_set.submit(spec("low1", total_tokens=1e5), sim_job(clock))
    job_set.submit(spec("high", priority=1, total_tokens=300.0), sim_job(clock))
    job_set.submit(spec("low2", total_tokens=1e5), sim_job(clock))
    ran = run(job_set, 43)
    assert ran[:4] == ["high"] * 3 + ["low1"]
    low1, low2 = job_set.members["low1"].used_ms, job_set.members["low2"].used_ms
    assert low1 + low2 == 4000.0 and abs(low1 - low2) <= 200.0 + 100.0
    turns = sum(1 for a, b in pairwise(ran[3:]) if a != b)
    assert 4 <= turns <= 40 // 2  # shares alternate, in turns of about a quantum, not every unit


def test_deadline_the_measured_rate_cannot_meet_is_refused_with_numbers():
    clock = SimClock()
    job_set = JobSet(clock)
    job_set.submit(spec("first"), sim_job(clock))
    run(job_set, 3)  # measures 1000 tokens/s
    assert job_set.harvest_tokens_per_s() == pytest.approx(1000.0)
    with pytest.raises(DeadlineError, match=r"5000 tokens at the measured 1000.0 tokens/s would finish its work "
                                            r"at 5, 3 s after its deadline 2"):
        job_set.submit(spec("late", total_tokens=5000.0, deadline_s=2.0), sim_job(clock))
    assert "late" not in job_set.members
    job_set.submit(spec("late", total_tokens=5000.0, deadline_s=2.0, is_best_effort=True), sim_job(clock))
    with pytest.raises(HarvestError, match="^deadline_s: 0 is in the past"):
        job_set.submit(spec("past", deadline_s=0.1, submitted_s=0.0), sim_job(clock))


def test_a_new_deadline_that_breaks_an_admitted_one_is_refused():
    clock = SimClock()
    job_set = JobSet(clock, prior_tokens_per_s=1000.0)
    job_set.submit(spec("admitted", total_tokens=2000.0, deadline_s=2.5), sim_job(clock))
    with pytest.raises(DeadlineError, match="job 'admitted''s work"):
        job_set.submit(spec("greedy", total_tokens=1000.0, deadline_s=1.5), sim_job(clock))


def test_pause_skips_the_job_and_resume_brings_it_back():
    clock = SimClock()
    job_set = JobSet(clock, fair_share_quantum_ms=0.0)
    job_set.submit(spec("a", priority=1), sim_job(clock))
    job_set.submit(spec("b"), sim_job(clock))
    assert run(job_set, 1) == ["a"]
    job_set.pause("a")
    assert run(job_set, 2) == ["b", "b"]
    assert job_set.job_state(job_set.members["a"]) == "paused"
    job_set.resume("a")
    assert run(job_set, 1) == ["a"]
    job_set.cancel("a")
    assert run(job_set, 1) == ["b"]
    with pytest.raises(HarvestError, match="cannot pause job 'a': it is cancelled"):
        job_set.pause("a")
    with pytest.raises(KeyError):
        job_set.resume("nope")


class MidUpdateEngine:
    num_window_layers = 2

    def __init__(self):
        self.is_mid_update = False
        self.windows = []

    def set_window(self, num_layers):
        self.windows.append(num_layers)


def test_switch_waits_for_the_step_boundary_and_evicts_the_window():
    """A tighter job arrives while the active one is mid-update (forced: its engine says so): the set keeps
    the active job until the update ends, then evicts its window before the other job runs."""
    clock = SimClock()
    job_set = JobSet(clock, prior_tokens_per_s=1000.0)
    first = sim_job(clock)
    first.engine = MidUpdateEngine()
    job_set.submit(spec("first"), first)
    assert run(job_set, 1) == ["first"]
    first.engine.is_mid_update = True
    job_set.submit(spec("urgent", deadline_s=10.0), sim_job(clock))
    assert run(job_set, 2) == ["first", "first"]
    assert first.engine.windows == []
    first.engine.is_mid_update = False
    assert run(job_set, 1) == ["urgent"]
    assert first.engine.windows == [0]
    assert job_set.num_switches == 1
    job_set.cancel("urgent")
    assert run(job_set, 1) == ["first"]
    assert first.engine.windows == [0, 2]  # switched back in: its window as it was


def test_state_with_nothing_to_run():
    clock = SimClock()
    job_set = JobSet(clock)
    assert job_set.state.value == "finished" and not job_set.has_ready_work() and job_set.engine is None
    job_set.submit(spec("a"), sim_job(clock))
    job_set.pause("a")
    job_set.poll()
    assert job_set.state.value == "paused" and not job_set.has_ready_work()


def test_is_fetching_while_the_active_jobs_layer_is_fetched():
    """What lets the idle loop wait a millisecond instead of until a request (HarvestRuntime.on_idle)."""
    clock = SimClock()
    job_set = JobSet(clock)
    job = sim_job(clock)
    job_set.submit(spec("a"), job)
    job_set.poll()
    assert job_set.active_name == "a" and not job_set.is_fetching
    job.is_ready, job.state = False, FinetuneState.WAITING
    job_set.poll()
    assert job_set.is_fetching and not job_set.has_ready_work()
    job_set.pause("a")
    job.state = FinetuneState.PAUSED
    job_set.poll()
    assert not job_set.is_fetching


# ---- simulation ----

# ---- intake: the real job check (LlamaFactory's parse and job_validation) before anything is queued ----

@pytest.fixture(scope="module")
def tiny_yaml(tmp_path_factory):
    from harvest.finetune.demo.tiny_job import write_tiny_job

    return write_tiny_job(tmp_path_factory.mktemp("tiny")).read_text()


@pytest.fixture
def intake(tmp_path):
    from harvest.finetune import FinetuneConfig
    from harvest.jobs.job_intake import JobIntake

    clock = SimClock()
    clock.t_s = 1000.0
    return JobIntake(JobSet(clock, prior_tokens_per_s=100.0), JobStore(tmp_path / "state"), FinetuneConfig(),
                     lambda spec, config: sim_job(clock))


def with_key(yaml_text, key, value):
    import yaml

    return yaml.safe_dump({**yaml.safe_load(yaml_text), key: value})


@pytest.mark.parametrize("change, fields, message", [
    (None, {"name": "Bad/Name"}, "^name: 'Bad/Name' must match"),
    (("lora_rnk", 8), {}, "lora_rnk"),
    (("lora_rank", "eight"), {}, "^lora_rank: 'eight' is not"),
    (("model_name_or_path", "/no/such/model"), {}, "/no/such/model"),
    (None, {"deadline_s": 999.0}, "^deadline_s: 999 is in the past"),
    (None, {"deadline_s": 1001.0}, r"^deadline_s: 2560 tokens at the measured 100.0 tokens/s"),
    (None, {"yaml_text": "a: [1\n"}, "^yaml: not valid YAML"),
    (None, {"yaml_text": "x: 1\n" * 20000}, "^yaml: .* bytes, more than"),
])
def test_bad_submission_names_the_problem_and_queues_nothing(intake, tiny_yaml, change, fields, message):
    intake.submit("good", tiny_yaml)
    text = with_key(tiny_yaml, *change) if change else tiny_yaml
    with pytest.raises(HarvestError, match=message):
        intake.submit(**{"name": "second", "yaml_text": text, **fields})
    assert list(intake.job_set.members) == ["good"]
    assert [r.spec.name for r in intake.store.load()] == ["good"]
    assert sorted(p.name for p in intake.store.state_dir.glob("*.yaml")) == ["good.yaml"]


def test_submission_is_sized_stored_and_queued(intake, tiny_yaml):
    record = intake.submit("good", tiny_yaml, priority=3, deadline_s=1100.0, publish_name="good-v")
    assert record.spec.total_tokens == 5 * 4 * 2 * 64  # max_steps x batch x accumulation x cutoff_len
    assert JobStore(intake.store.state_dir).get("good") == record
    assert intake.job_set.members["good"].spec == record.spec
    with pytest.raises(HarvestError, match="^name: a job named 'good' already exists"):
        intake.submit("good", tiny_yaml)


def test_restart_resumes_the_set_in_its_states(intake, tiny_yaml):
    """Three jobs (one running, one queued, one paused) and one cancelled, persisted; a fresh intake on the
    same state dir (a restarted worker) holds the three in the same states, the cancelled one not at all."""
    from harvest.jobs.job_intake import JobIntake

    for name, priority in (("run", 2), ("queue", 1), ("pause", 0), ("gone", 0)):
        intake.submit(name, tiny_yaml, priority=priority)
    intake.job_set.pause("pause")
    intake.job_set.cancel("gone")
    run(intake.job_set, 3)
    intake.persist()
    states = {n: intake.job_set.job_state(m) for n, m in intake.job_set.members.items()}
    assert states == {"run": "running", "queue": "queued", "pause": "paused", "gone": "cancelled"}

    clock = SimClock()
    configs = []
    again = JobIntake(JobSet(clock), JobStore(intake.store.state_dir), intake.config,
                      lambda spec, config: configs.append(config) or sim_job(clock))
    assert sorted(m.spec.name for m in again.restore()) == ["pause", "queue", "run"]
    assert again.job_set.members["run"].num_trained_tokens == 300.0
    assert all(c.yaml_path.endswith(".yaml") and not c.resume for c in configs)  # no checkpoint written yet
    run(again.job_set, 1)
    assert {n: again.job_set.job_state(m) for n, m in again.job_set.members.items()} == {
        "run": "running", "queue": "queued", "pause": "paused"}
