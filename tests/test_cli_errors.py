"""Bad CLI input gets one clear error line and a non-zero exit, never a traceback."""

import os
import socket
import subprocess

import psutil
import pytest
from conftest import free_port


def run_cli(harvest_cli, *args, timeout=120):
    return subprocess.run([*harvest_cli, *args], capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(result, *fragments):
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("harvest"), last
    for fragment in fragments:
        assert fragment in last, last


def test_missing_model_path(harvest_cli, tmp_path):
    result = run_cli(harvest_cli, "serve", "--model-path", str(tmp_path / "no-such-model"))
    assert_one_line_error(result, "no-such-model", "config.json")


def test_port_in_use(harvest_cli, tiny_model_dir):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_cli(harvest_cli, "serve", "--model-path", str(tiny_model_dir), "--port", str(port),
                         "--admin-port", str(free_port()))
        assert_one_line_error(result, "--port", str(port), "in use")
        result = run_cli(harvest_cli, "serve", "--model-path", str(tiny_model_dir), "--port", str(free_port()),
                         "--admin-port", str(port))
        assert_one_line_error(result, "--admin-port", str(port))


@pytest.mark.sglang
def test_admin_port_taken_while_the_worker_starts_stops_it_with_one_line(harvest_cli, tiny_model_dir, tmp_path):
    """The port is free when `harvest serve` checks it and taken before the scheduler binds it (another
    process got it while the model loaded): the worker stops, the CLI names the port, no process is left,
    nor the supervisor's files (the start-failure line came through them).
    A worker left serving without its admin API would answer its admin URL with whatever holds the port."""
    port, admin_port = free_port(), free_port()
    proc = subprocess.Popen([*harvest_cli, "serve", "--model-path", str(tiny_model_dir), "--port", str(port),
                             "--admin-port", str(admin_port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env={**os.environ, "TMPDIR": str(tmp_path)})
    lines = []
    with socket.socket() as busy:
        for line in proc.stderr:  # SGLang prints its server_args once harvest serve's own checks passed
            lines.append(line)
            if "server_args" in line.lower():
                serve_dirs = list(tmp_path.glob("harvest-serve-*"))
                busy.bind(("127.0.0.1", admin_port))
                busy.listen()
                break
        lines += proc.stderr.readlines()
        returncode = proc.wait(timeout=300)
    stderr = "".join(lines)
    assert returncode == 2, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("harvest serve: error:")]
    assert len(errors) == 1 and f"--admin-port {admin_port}" in errors[0] and "in use" in errors[0], stderr[-3000:]
    assert not psutil.pid_exists(proc.pid) or psutil.Process(proc.pid).status() == psutil.STATUS_ZOMBIE
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(port) in " ".join(p.info["cmdline"] or [])]
    assert len(serve_dirs) == 1 and not list(tmp_path.glob("harvest-serve-*"))


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--no-such-flag", "1"], ["unrecognized arguments", "--no-such-flag"]),
        (["--port", "http"], ["--port", "http"]),
        (["--disaggregation-mode", "prefill"], ["decode worker"]),
        (["--admin-host", "0.0.0.0"], ["--admin-token"]),
        (["--kv-block-kib", "48"], ["--kv-block-kib", "48"]),
        (["--pin-partition", "1"], ["--pin-partition", "INFER,FT", "'1'"]),
        (["--pin-partition", "1,1"], ["--pin-partition needs --tpot-slo-ms"]),
        (["--colocation", "sideways"], ["--colocation", "sideways"]),
        (["--colocation", "temporal"], ["--colocation temporal needs --tpot-slo-ms"]),
        (["--replica-id", "w0"], ["--replica-id needs --fleet"]),
        (["--fleet", "http://127.0.0.1:9"], ["--fleet needs --replica-id"]),
        (["--fleet", "http://127.0.0.1:9", "--replica-id", "w0"], ["--fleet needs --fleet-shard K/N"]),
        (["--fleet", "http://127.0.0.1:9", "--replica-id", "w0", "--fleet-shard", "2/2"], ["--fleet-shard 2/2"]),
        (["--fleet", "10.0.0.1", "--replica-id", "w0", "--fleet-shard", "0/2"], ["is not a lighthouse URL"]),
        (["--fleet", "http://127.0.0.1:9", "--replica-id", "w:0", "--fleet-shard", "0/2"], ["--replica-id 'w:0'"]),
        (["--fleet", "http://127.0.0.1:9", "--replica-id", "w0", "--fleet-shard", "0/2"], ["--fleet needs --finetune"]),
        (["--tpot-slo-ms", "100", "--profile", "predictor/profiles/synthetic-h100-llama3-8b.json"],
         ["SYNTHETIC", "--allow-synthetic-profile"]),
        (["--finetune-resume"], ["--finetune-resume needs --finetune"]),
        # The job's settings are checked before its YAML is read: the error names serve's flag, not the field.
        (["--finetune", "job.yaml", "--tpot-slo-ms", "50", "--finetune-window-layers", "0"],
         ["--finetune-window-layers", "got 0"]),
        (["--finetune", "job.yaml", "--tpot-slo-ms", "50", "--finetune-max-unit-ms", "-1"],
         ["--finetune-max-unit-ms", "got -1.0"]),
    ],
)
def test_bad_serve_flags(harvest_cli, tiny_model_dir, args, fragments):
    result = run_cli(harvest_cli, "serve", "--model-path", str(tiny_model_dir), "--admin-port", str(free_port()),
                     *args)
    assert_one_line_error(result, *fragments)


def test_unknown_subcommand(harvest_cli):
    result = run_cli(harvest_cli, "frobnicate")
    assert_one_line_error(result, "frobnicate")


def test_profile_co_run_needs_a_finetune_job(harvest_cli, tmp_path):
    result = run_cli(harvest_cli, "profile", "--co-run", "--out", str(tmp_path / "p.json"))
    assert_one_line_error(result, "--co-run needs --finetune")


@pytest.mark.parametrize("flag", ["--repeats", "--passes"])
def test_profile_needs_a_timed_step_and_a_visit(harvest_cli, tmp_path, flag):
    result = run_cli(harvest_cli, "profile", flag, "0", "--out", str(tmp_path / "p.json"))
    assert_one_line_error(result, "--repeats and --passes must be >= 1")
    assert not (tmp_path / "p.json").exists()


def test_profile_co_run_too_small_to_fit_stage_2_is_refused_before_any_worker(harvest_cli, tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("stage: sft\n")
    result = run_cli(harvest_cli, "profile", "--co-run", "--finetune", str(job), "--max-batch-size", "3",
                     "--out", str(tmp_path / "p.json"))
    assert_one_line_error(result, "stage 2 needs >= 4", "--max-batch-size")
    assert not (tmp_path / "p.json").exists()


def test_a_fleet_worker_with_no_lighthouse_there_is_refused_before_it_starts(harvest_cli, tmp_path):
    from harvest.finetune.demo.tiny_job import write_tiny_job

    job = write_tiny_job(tmp_path)
    result = run_cli(harvest_cli, "serve", "--model-path", str(tmp_path / "tiny-llama-2l"), "--admin-port",
                     str(free_port()), "--finetune", str(job), "--tpot-slo-ms", "100",
                     "--fleet", f"http://127.0.0.1:{free_port()}", "--replica-id", "w0", "--fleet-shard", "0/2")
    assert_one_line_error(result, "--fleet", "no torchft lighthouse answers there")
