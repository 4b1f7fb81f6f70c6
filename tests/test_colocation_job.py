"""FinetuneJob isolates failures of the real engine and runs it only when told to."""

import gc
import threading
import time

import pytest

from base.errors import HarvestError
from harvest.colocation.finetune_job import HELD_MEMORY_STATS, FinetuneJob, _build_engine
from harvest.finetune import FinetuneConfig
from harvest.finetune.demo.tiny_job import write_tiny_job


def build_job(tmp_path, fail_at_unit: int | None = None) -> FinetuneJob:
    yaml_path = write_tiny_job(tmp_path, max_steps=50, save_steps=1000)

    def factory(spec):
        engine = _build_engine(spec)
        if fail_at_unit is not None:
            run_next_unit = engine.run_next_unit
            calls = []

            def failing_run_next_unit():  # the injected fault: the engine raises mid-run
                calls.append(1)
                if len(calls) == fail_at_unit:
                    raise RuntimeError("injected finetune fault")
                return run_next_unit()

            engine.run_next_unit = failing_run_next_unit
        return engine

    job = FinetuneJob(FinetuneConfig(yaml_path=str(yaml_path)), engine_factory=factory)
    job.start()
    assert job.wait_built(timeout_s=120)
    return job


def stop_from_scheduler(job: FinetuneJob) -> bool:
    """request_stop from another thread while this one polls as the scheduler thread does between units."""
    done = []
    stopper = threading.Thread(target=lambda: done.append(job.request_stop(timeout_s=30)))
    stopper.start()
    deadline = time.monotonic() + 30
    while stopper.is_alive() and time.monotonic() < deadline:
        assert job.has_ready_work() or job.state.value == "stopped"  # the query changes nothing ...
        job.poll()  # ... the scheduler thread's explicit turn between units acts on the request
        time.sleep(0.01)
    stopper.join()
    return done == [True]


def test_failure_mid_run_is_contained(tmp_path):
    job = build_job(tmp_path, fail_at_unit=7)
    assert job.state.value == "running", job.error
    assert gc.get_freeze_count() > 0, "the built job's objects are frozen out of the cyclic GC"
    assert "resident_bytes" in job.stats()
    results = [job.run_unit() for _ in range(6)]
    assert all(r is not None for r in results)
    job.poll()
    assert job.has_ready_work()
    assert job.run_unit() is None
    assert job.state.value == "failed" and "injected finetune fault" in job.error
    assert job.engine is None  # its memory is released
    assert gc.get_freeze_count() == 0, "unfrozen, so the dropped engine's cycles are collected"
    job.poll()
    assert not set(HELD_MEMORY_STATS) & job.stats().keys(), "stats report released memory"
    assert not job.has_ready_work()
    with pytest.raises(HarvestError, match="failed"):
        job.resume()
    assert job.request_stop(timeout_s=1)


def test_pause_blocks_units_and_stop_checkpoints(tmp_path):
    job = build_job(tmp_path)
    job.pause()
    job.poll()
    assert job.state.value == "paused" and not job.has_ready_work()
    job.resume()
    assert job.has_ready_work()
    while job.stats().get("step", 0) < 1:
        assert job.run_unit() is not None
    assert job.stats()["loss"] is not None

    assert stop_from_scheduler(job) and job.state.value == "stopped"
    assert list((tmp_path / "out").glob("checkpoint-*")), "no checkpoint written on stop"


def test_the_fleets_work_at_a_step_end_is_charged_to_that_unit(tmp_path):
    """A round's work on the unit thread (the adapter's copies, applying a round) runs in the step-end unit's
    slot: the unit's duration the controller records covers it; other units are the engine's own times."""
    from torchft.coordination import LighthouseServer

    from harvest.fleet import RoundPolicy
    from harvest.fleet.fleet_config import FleetConfig
    from harvest.fleet.fleet_member import join_fleet

    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1)
    engine_ms = []

    def factory(spec):
        engine = _build_engine(spec)
        run_next_unit = engine.run_next_unit

        def timed():
            result = run_next_unit()
            engine_ms.append(result.duration_ms)
            return result

        engine.run_next_unit = timed
        return engine

    config = FleetConfig(lighthouse.address(), "r0", (0, 1), RoundPolicy(every_tokens=1),
                         checkpoint_dir=str(tmp_path / "rounds"), timeout_s=10)

    job = FinetuneJob(FinetuneConfig(yaml_path=str(write_tiny_job(tmp_path, max_steps=50, save_steps=1000))),
                      engine_factory=factory,
                      fleet_join=lambda engine: join_fleet(engine, config))
    try:
        job.start()
        assert job.wait_built(timeout_s=120), job.error
        results = []
        while sum(r.is_step_end for r in results) < 3:
            results.append(job.run_unit())
        step_ends = [(r.duration_ms, ms) for r, ms in zip(results, engine_ms) if r.is_step_end]
        assert all(charged > own for charged, own in step_ends), step_ends
        assert all(r.duration_ms == ms for r, ms in zip(results, engine_ms) if not r.is_step_end)
        assert job.stats()["fleet"]["round"] >= 2
    finally:
        assert stop_from_scheduler(job)
        lighthouse.shutdown()
