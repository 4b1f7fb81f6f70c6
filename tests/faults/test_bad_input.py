"""Every class of bad input (job YAML, trace, profile, flag, admin request) gets one error line naming the
problem and exit code 2 (an admin request: a 4xx with the reason), never a traceback, and `harvest serve`
refuses a bad job before any worker starts."""

import socket
import subprocess
import sys
import time

# Imported before any test captures stderr: LlamaFactory's log handler keeps the stream it first saw, and
# a closed capsys stream would print "--- Logging error ---" with a traceback into later tests' output.
import llamafactory.hparams  # noqa: F401
import pytest
import yaml
from conftest import free_port
from fastapi.testclient import TestClient

from faults.figures import record
from harvest.admin.admin_app import create_admin_app
from harvest.cli.main import main
from harvest.config import AdminConfig, ServeConfig
from harvest.finetune.demo.tiny_job import write_tiny_job
from harvest.runtime import HarvestRuntime

ERROR_LINES: dict[str, str] = {}
SERVE_REFUSES_WITHIN_S = 30.0  # the checks import LlamaFactory (~8 s here); a worker takes a minute to start


@pytest.fixture(scope="module", autouse=True)
def record_error_lines():
    yield
    record("bad input", num_cases=len(ERROR_LINES), error_lines=ERROR_LINES)


@pytest.fixture(scope="module")
def job_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("bad-input")


@pytest.fixture(scope="module")
def good_job(job_dir):
    return write_tiny_job(job_dir, max_steps=2)


def run_main(capsys, case: str, *argv) -> str:
    """Run the CLI in this process; returns its one error line after checking the exit code."""
    code = main(list(argv))
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"harvest {argv[0]}: error: "), line
    ERROR_LINES[case] = line
    return line


def bad_job(job_dir, good_job, name: str, **overrides) -> str:
    job = {**yaml.safe_load(good_job.read_text()), **overrides}
    path = job_dir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job))
    return str(path)


BAD_JOBS = [
    ("lora_rank not an integer", {"lora_rank": "eight"}, "lora_rank: 'eight' is not an integer"),
    ("lora_rank negative", {"lora_rank": -1}, "lora_rank: -1 must be >= 1"),
    ("lora_dropout out of range", {"lora_dropout": 1.5}, "lora_dropout: 1.5 must be in [0, 1)"),
    ("learning_rate as text", {"learning_rate": "1e-3"}, "learning_rate: '1e-3' is not a number"),
    ("batch size zero", {"per_device_train_batch_size": 0}, "per_device_train_batch_size: 0 must be >= 1"),
    ("dataset missing", {"dataset": "no_such_dataset"}, "dataset: 'no_such_dataset' is not listed"),
    ("output_dir not creatable", {"output_dir": "{file}/out"}, "cannot be created: '{file}' is a file"),
    ("unsupported key", {"use_dora": False, "deepspeed": "ds.json"}, "deepspeed: DeepSpeed is not supported"),
]


@pytest.mark.parametrize("case, overrides, expected", BAD_JOBS, ids=[c for c, _, _ in BAD_JOBS])
def test_bad_job_values(capsys, job_dir, good_job, case, overrides, expected):
    a_file = job_dir / "a-file"
    a_file.write_text("")
    overrides = {k: v.replace("{file}", str(a_file)) if isinstance(v, str) else v for k, v in overrides.items()}
    expected = expected.replace("{file}", str(a_file))
    path = bad_job(job_dir, good_job, case.replace(" ", "_"), **overrides)
    assert expected in run_main(capsys, f"job YAML: {case} (finetune)", "finetune", path, "--quiet")
    line = run_main(capsys, f"job YAML: {case} (serve)", "serve", "--finetune", path, "--tpot-slo-ms", "100")
    assert expected in line


def test_job_file_that_is_not_yaml(capsys, job_dir):
    path = job_dir / "broken.yaml"
    path.write_text("lora_rank: [8\n")
    assert "is not valid YAML at line" in run_main(capsys, "job YAML: not YAML", "finetune", str(path))


def test_resume_without_checkpoint(capsys, good_job):
    line = run_main(capsys, "job YAML: --resume without a checkpoint", "finetune", str(good_job), "--resume")
    assert line.startswith("harvest finetune: error: --resume: no harvest checkpoint in output_dir"), line
    line = run_main(capsys, "job YAML: --finetune-resume without a checkpoint", "serve", "--finetune", str(good_job),
                    "--tpot-slo-ms", "100", "--finetune-resume")
    assert line.startswith("harvest serve: error: --finetune-resume: no harvest checkpoint in output_dir"), line


@pytest.mark.parametrize("argv, expected", [
    (["finetune", "{job}", "--window", "0"], "--window must be >= 1"),
    (["finetune", "{job}", "--device", "gpu"], "--device 'gpu' is not a torch device"),
    (["finetune", "{job}", "--set", "lora_rank"], "--set 'lora_rank': expected KEY=VALUE"),
    (["serve", "--finetune", "{job}", "--tpot-slo-ms", "100", "--finetune-window-layers", "0"],
     "--finetune-window-layers must be >= 1"),
    (["serve", "--finetune", "{job}", "--tpot-slo-ms", "100", "--finetune-max-unit-ms", "-5"],
     "--finetune-max-unit-ms must be > 0"),
    (["serve", "--finetune", "{job}"], "--finetune needs --tpot-slo-ms"),
    (["serve", "--admin-token", ""], "--admin-token is empty"),
    (["serve", "--admin-token", "   "], "--admin-token is empty"),
    (["serve", "--admin-host", "0.0.0.0", "--admin-token", ""], "--admin-token is empty"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_bad_flags(capsys, good_job, argv, expected):
    argv = [str(good_job) if a == "{job}" else a for a in argv]
    shown = " ".join("CFG.yaml" if a == str(good_job) else a if a.strip() else repr(a) for a in argv)
    line = run_main(capsys, f"flag: harvest {shown}", *argv)
    assert expected in line


@pytest.mark.parametrize("trace, expected", [
    ("nosuch", "is not a file, a shipped trace"),
    ("{csv}", "header must be TIMESTAMP,ContextTokens,GeneratedTokens"),
    ("poisson:rate=-1,duration=10,seed=0", "rate"),
])
def test_bad_traces(capsys, job_dir, trace, expected):
    csv = job_dir / "trace.csv"
    csv.write_text("a,b\n1,2\n")
    trace = trace.replace("{csv}", str(csv))
    line = run_main(capsys, f"trace: {trace if trace != str(csv) else 'CSV with a wrong header'}", "replay",
                    "--trace", trace, "--simulate", "--out", str(job_dir / "replay"))
    assert expected in line


@pytest.mark.parametrize("content, expected", [
    ('{"x": 1}', "schema_version is missing"),
    ("not json", "profile.json"),
])
def test_bad_profiles(capsys, job_dir, tiny_model_dir, content, expected):
    path = job_dir / "profile.json"
    path.write_text(content)
    line = run_main(capsys, f"profile: {content}", "serve", "--model-path", str(tiny_model_dir), "--profile",
                    str(path), "--tpot-slo-ms", "100")
    assert expected in line


def test_serve_refuses_a_bad_job_before_any_worker_starts(job_dir, good_job, tiny_model_dir):
    """A subprocess, as a user runs it: exit 2 within the bound, no traceback, the ports never bound."""
    path = bad_job(job_dir, good_job, "eight", lora_rank="eight")
    port, admin_port = free_port(), free_port()
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "harvest.cli.main", "serve", "--model-path", str(tiny_model_dir),
                             "--finetune", path, "--tpot-slo-ms", "100", "--port", str(port),
                             "--admin-port", str(admin_port)], capture_output=True, text=True, timeout=120)
    elapsed_s = time.monotonic() - started
    record("harvest serve with a bad job", exit_code=result.returncode, refused_after_s=round(elapsed_s, 1),
           error_line=result.stderr.strip().splitlines()[-1])
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1] == "harvest serve: error: lora_rank: 'eight' is not an integer"
    assert elapsed_s < SERVE_REFUSES_WITHIN_S
    assert "sglang" not in result.stderr.lower(), "the worker started"
    for p in (port, admin_port):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", p))


@pytest.fixture(scope="module")
def admin_client():
    runtime = HarvestRuntime(ServeConfig(admin=AdminConfig(token="s3cret")))
    return TestClient(create_admin_app(runtime))


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer ", "Bearer    ", "bearer wrong", "Basic s3cret",
                                    "s3cret"])
def test_admin_rejects_every_malformed_authorization(admin_client, header):
    headers = {} if header is None else {"Authorization": header}
    response = admin_client.post("/harvest/finetune/pause", headers=headers)
    ERROR_LINES[f"admin request: Authorization {header!r}"] = f"{response.status_code} {response.json()['detail']}"
    assert response.status_code == 401


def test_admin_accepts_the_token_and_names_bad_requests(admin_client):
    auth = {"Authorization": "Bearer s3cret"}
    assert admin_client.post("/harvest/finetune/pause", headers=auth).status_code == 409  # authorised; no job
    for method, path, params, status in [("post", "/harvest/finetune/explode", None, 404),
                                         ("get", "/harvest/finetune/pause", None, 405),
                                         ("get", "/harvest/stats", {"window_steps": 0}, 422),
                                         ("get", "/harvest/steps", {"since": -1}, 422)]:
        response = getattr(admin_client, method)(path, headers=auth, params=params)
        ERROR_LINES[f"admin request: {method.upper()} {path} {params or ''}".strip()] = (
            f"{response.status_code} {str(response.json()['detail'])[:160]}")
        assert response.status_code == status
