"""`harvest bench colocate` at CI scale: every row is produced, live, by real workers and real trainers.

Checks that each row ran and measured what it reports, not how the rows compare (that is eval/README.md's
job on the full windows). Tiny model, tiny job, one short window, one repeat.
"""

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from harvest.bench.colocate import CORE_PROFILE, ROWS, RUNS_LOG, _partition_rates, _verdict_line, _verdicts
from harvest.finetune.demo.tiny_job import write_tiny_job


@pytest.mark.sglang
@pytest.mark.timeout(2400)  # over the sglang mark's 1800 s: every row's workers run one after another
def test_every_row_is_measured_and_nothing_is_left_running(tiny_model_dir, tmp_path, harvest_cli):
    """A two-scale sweep: each row is measured at both scales, by one worker (and trainer) for the sweep."""
    job = write_tiny_job(tmp_path, model_name_or_path=str(tiny_model_dir))
    proc = subprocess.run(
        [*harvest_cli, "bench", "colocate", "--window", "ci=conv:17s+2s", "--rate-scale", "1,2",
         "--max-context-tokens", "96", "--max-generated-tokens", "6", "--repeats", "1", "--warmup-steps", "1",
         "--tpot-ms", "500", "--drain-s", "60", "--model-path", str(tiny_model_dir), "--job", str(job),
         "--max-total-tokens", "4096", "--start-timeout-s", "300", "--log-dir", str(tmp_path / "logs"),
         "--dtype", "float32"],
        # The test's own bound less its set-up: at least 3x the slowest run (tests/durations.txt).
        capture_output=True, text=True, timeout=2300, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert set(result["table"]) == {"ci@1", "ci@2"}
    # The runs as they ended, kept in the log folder for a sweep stopped midway: the same runs, in order.
    kept = [json.loads(line) for line in (tmp_path / "logs" / RUNS_LOG).read_text().splitlines()]
    fields = ("window", "repeat", "row", "replay_results", "num_steps", "finetune_tokens")
    assert [[run[f] for f in fields] for run in kept] == [[run[f] for f in fields] for run in result["runs"]]
    assert all(set(table) == set(ROWS) for table in result["table"].values())
    # Scale 2 replays the same requests in half the time: the same count, each scale in its own replay.
    assert result["windows"]["ci@1"]["num_requests"] == result["windows"]["ci@2"]["num_requests"]
    for run in result["runs"]:
        row = (run["window"], run["row"])
        assert run["host"]["ping_pong_us"] > 0 and all(ms > 0 for ms in run["host"]["decode_loop_ms"].values()), row
        assert run["num_requests"] == result["windows"][run["window"]]["num_requests"], row
        assert run["num_unfinished_requests"] == 0, (row, run["notes"])
        assert run["num_steps"] > 0, row
        assert 0 < run["tpot_ms_p50"] <= run["tpot_ms_p99"] and run["replay_s"] > 0, row
        replay = json.loads(Path(run["replay_results"]).read_text())["policies"]["live"]["decode"]
        assert replay["num_steps"] == run["num_steps"], row
        assert run["steps_within_target"] == replay["step_slo_attainment"], row  # the row is its replay's
        steps = json.loads(Path(run["step_records"]).read_text())  # the worker's records of the replay's steps
        assert len(steps) == run["num_steps"] and all("infer_sms" in step for step in steps), row
    # One worker a row for the whole sweep: both scales' replays went to it (its log), each replay its own file.
    by_row = {row: [run for run in result["runs"] if run["row"] == row] for row in ROWS}
    for row, row_runs in by_row.items():
        assert [run["window"] for run in row_runs] == ["ci@1", "ci@2"], row
        assert len({run["worker_log"] for run in row_runs}) == 1, row
        assert len({run["replay_results"] for run in row_runs}) == 2, row
    runs = {row: row_runs[0] for row, row_runs in by_row.items()}  # scale 1
    assert runs["decode-alone"]["finetune_tokens_per_s"] is None
    # --dtype reaches every worker: served in the job's float32, the harvest rows' job computes on the served weights.
    assert {row: run["base_weights"] for row, run in runs.items()} == {
        row: "shared" if row.startswith("harvest-") else None for row in ROWS}
    assert result["config"]["dtype"] == "float32" and "--dtype float32" in result["command"]
    assert result["config"]["profile"] == str(CORE_PROFILE) and f"--profile {CORE_PROFILE}" in result["command"]
    for row in ROWS:
        if row != "decode-alone":
            assert runs[row]["finetune_tokens_per_s"] > 0, (row, runs[row]["finetune_counted_by"])
    assert set(result["tpot_stretch_vs_decode_alone"]["ci@1"]) == {r for r in ROWS if r.startswith("harvest-")}
    # Each scale's verdict weighs the default against every other row that trains.
    assert set(result["verdicts"]) == {"ci@1", "ci@2"}
    assert set(result["verdicts"]["ci@1"]["rows"]) == set(ROWS) - {"decode-alone"}
    # Only the default, spatial without a profile or a pin, chooses its split live: the whole device or (1, 1).
    assert {row for row, run in runs.items() if run["phases_per_split"] is not None} == {"harvest-default"}
    assert set(runs["harvest-default"]["phases_per_split"]) == {"whole", "1,1"}
    # No worker or trainer outlives the bench: no process still runs on this test's model or files.
    leftovers = [p.info["cmdline"] for p in psutil.process_iter(["cmdline"])
                 if any(str(tmp_path) in arg or str(tiny_model_dir) in arg for arg in p.info["cmdline"] or [])]
    assert not leftovers


def verdict_runs(window: str, rows: dict) -> list[dict]:
    """Runs of `window`: rows maps a row to its repeats' (finetune tok/s, steps within target)."""
    return [{"window": window, "row": row, "finetune_tokens_per_s": rate, "steps_within_target": share}
            for row, repeats in rows.items() for rate, share in repeats]


def test_the_verdict_weighs_the_default_against_the_row_that_trained_most_within_the_a_a_spread():
    alone = [(None, 1.0), (None, 1.0)]
    runs = [
        # ahead of both; temporal's repeats 40 and 50: a spread of 25 %
        *verdict_runs("a", {"decode-alone": alone, "harvest-default": [(60.0, 1.0), (62.0, 1.0)],
                            "harvest-temporal": [(40.0, 1.0), (50.0, 1.0)],
                            "two-process-pinned": [(55.0, 1.0), (57.0, 1.0)]}),
        # 0.9x the pinned split, whose repeats differ by 22 %: within noise
        *verdict_runs("b", {"harvest-default": [(45.0, 1.0), (45.0, 0.9995)],
                            "two-process-pinned": [(45.0, 1.0), (55.0, 1.0)]}),
        # 0.5x a pinned split that missed the target in a repeat: behind it, ahead of temporal, which kept it
        *verdict_runs("c", {"harvest-default": [(30.0, 1.0), (30.0, 1.0)],
                            "harvest-temporal": [(20.0, 1.0), (20.0, 1.0)],
                            "two-process-pinned": [(60.0, 1.0), (60.0, 0.95)]}),
        # the default missed in one repeat: whatever it trained
        *verdict_runs("d", {"harvest-default": [(90.0, 1.0), (90.0, 0.998)],
                            "two-process-pinned": [(50.0, 1.0), (50.0, 1.0)]}),
        # one repeat: no A/A spread, so a default 1 % behind is behind
        *verdict_runs("e", {"harvest-default": [(49.5, 1.0)], "two-process-pinned": [(50.0, 1.0)]}),
    ]
    verdicts = _verdicts(runs)
    assert {w: v["verdict"] for w, v in verdicts.items()} == {
        "a": "ahead", "b": "within noise", "c": "behind", "d": "misses the target", "e": "behind"}
    assert verdicts["a"]["best_row"] == "two-process-pinned" and "decode-alone" not in verdicts["a"]["rows"]
    assert verdicts["a"]["rows"]["harvest-temporal"]["aa_spread"] == 0.25
    assert verdicts["b"]["ratio"] == 0.9 and verdicts["b"]["aa_spread"] == round(55 / 45 - 1, 4)
    assert verdicts["c"]["rows"]["two-process-pinned"]["keeps_target"] is False
    assert verdicts["c"]["best_row_keeping_target"] == "harvest-temporal"
    assert verdicts["c"]["ratio_to_best_row_keeping_target"] == 1.5
    assert "against the best row that keeps the target, harvest (temporal)" in _verdict_line(verdicts["c"])
    assert verdicts["e"]["aa_spread"] is None and "no A/A spread" in _verdict_line(verdicts["e"])


def test_a_partitions_rate_is_its_work_over_the_replay_not_the_workers_life():
    def stats(job_tokens, job_work, co_run):
        return {"finetune": {"tokens": job_tokens}, "colocation": {"unit_tokens": job_work, "co_run": co_run}}

    before = stats(500, 50_000, {"1,1": {"tokens": 900, "unit_tokens": 30_000, "ms_granted": 30000.0}})
    after = stats(1000, 100_000, {"1,1": {"tokens": 1000, "unit_tokens": 90_000, "ms_granted": 40000.0},
                                  "1,3": {"tokens": 40, "unit_tokens": 4000, "ms_granted": 500.0}})
    # 60000 tokens through units in the 10 s held during the replay, at the job's 100 units a trained token; the
    # trained tokens counted there (100) are left out; a partition held under a second has no rate
    assert _partition_rates(before, after) == {"1,1": 60.0, "1,3": None}


def test_a_child_started_to_stop_with_its_parent_stops_when_the_parent_is_killed(tmp_path):
    """Pins `WorkerProcess(stop_with_parent=True)` (what the bench starts its workers and trainers with):
    the parent is SIGKILLed, so no `finally` of its runs; the child must get SIGTERM from the kernel."""
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from harvest.worker.process import WorkerProcess
        child = WorkerProcess(["-c", "import time; time.sleep(600)"], None, 0, {str(tmp_path / "child.log")!r},
                              command=[{sys.executable!r}], stop_with_parent=True).launch()
        print(child.proc.pid, flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True)
    child = psutil.Process(int(parent.stdout.readline()))
    assert child.is_running()
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while child.is_running() and child.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE


@pytest.mark.parametrize("flags, message", [
    (["--window", "steady"], "expected NAME=TRACE:START+LENGTH"),
    (["--rows", "decode-alone,three-processes"], "unknown row 'three-processes'"),
    (["--window", "x=conv:99999s+1s"], "no request arrives"),
    (["--rows", "harvest-spatial", "--profile", "no-such.json"], "cannot read profile no-such.json"),
    (["--rate-scale", "0.1,fast"], "--rate-scale '0.1,fast': expected positive numbers"),
    (["--rate-scale", "0.1,0"], "expected positive numbers"),
])
def test_bad_flags_get_one_line_and_start_nothing(flags, message, harvest_cli, tmp_path):
    proc = subprocess.run([*harvest_cli, "bench", "colocate", *flags, "--log-dir", str(tmp_path / "logs")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "logs").exists()
