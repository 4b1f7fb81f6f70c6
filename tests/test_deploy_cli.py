"""`harvest deploy`: the command lines it builds for each device, and bad input as one line, no traceback,
no process left behind."""

import subprocess
from pathlib import Path

import psutil
import pytest

from base.errors import HarvestError
from harvest.deploy import DeployConfig
from harvest.deploy.pd_deployment import (
    PDDeployment,
    free_deploy_ports,
    prefill_lora_flags,
)
from harvest.finetune.demo.tiny_job import write_tiny_job
from harvest.sglang.pd_flags import (
    NUM_TRANSFER_PORTS,
    decode_flags,
    prefill_command,
    router_command,
    worker_env,
)


def test_cpu_prefill_uses_tcp_transfer_and_cpu_flags_and_gpu_names_the_ib_device():
    cpu = prefill_command("M", "127.0.0.1", 8998, is_cpu_host=True, ib_device=None, max_total_tokens=4096)
    assert cpu[cpu.index("--disaggregation-mode") + 1] == "prefill"
    assert cpu[cpu.index("--disaggregation-transfer-backend") + 1] == "mooncake"
    assert cpu[cpu.index("--disaggregation-bootstrap-port") + 1] == "8998"
    # SGLang fails on a CPU host given an IB device ("InfiniBand sysfs path not found").
    assert "--disaggregation-ib-device" not in cpu and "fake" not in cpu
    assert {"--device", "--attention-backend", "--sleep-on-idle"} <= set(cpu)
    gpu = prefill_command("M", "127.0.0.1", 8998, is_cpu_host=False, ib_device="mlx5_0", max_total_tokens=None)
    assert gpu[gpu.index("--disaggregation-ib-device") + 1] == "mlx5_0" and "--device" not in gpu
    assert decode_flags("127.0.0.1", "mlx5_0")[:4] == ["--disaggregation-transfer-backend", "mooncake",
                                                     "--disaggregation-ib-device", "mlx5_0"]
    router = router_command("127.0.0.1", 29000, "http://127.0.0.1:30010", 8998, ["http://127.0.0.1:30001"], 60)
    assert router[router.index("--prefill") + 1: router.index("--prefill") + 3] == ["http://127.0.0.1:30010", "8998"]


def test_a_publishing_job_gives_the_prefill_worker_its_lora_flags_and_the_decode_worker_its_url(tmp_path):
    """The decode worker's job publishes its adapter: the prefill worker (which computes the prompts of
    requests naming it) runs with the job's LoRA flags through harvest's prefill entry, and the decode worker
    publishes to it too. Without publishing the prefill worker is plain `sglang.launch_server`."""
    publishing = write_tiny_job(tmp_path / "a", publish_every_steps=5)
    flags = prefill_lora_flags(("--finetune", str(publishing), "--tpot-slo-ms", "500"), is_cpu_host=True)
    assert flags[:3] == ("--enable-lora", "--max-lora-rank", "4") and "torch_native" in flags
    assert prefill_lora_flags(("--finetune", str(write_tiny_job(tmp_path / "b")),), is_cpu_host=True) == ()
    assert prefill_lora_flags(("--tpot-slo-ms", "500"), is_cpu_host=True) == ()
    config = DeployConfig(model_path="M", log_dir=tmp_path, prefill_lora_flags=flags)
    deployment = PDDeployment(config, is_cpu_host=True)
    prefill, decode = deployment.prefill.argv, deployment.decode.argv
    assert prefill[prefill.index("-m") + 1] == "harvest.sglang.prefill_worker" and prefill[-len(flags) - 2:-2] == list(flags)
    assert decode[decode.index("--publish-to") + 1] == deployment.prefill.url
    plain = PDDeployment(DeployConfig(model_path="M", log_dir=tmp_path), is_cpu_host=True)
    assert plain.prefill.argv[plain.prefill.argv.index("-m") + 1] == "sglang.launch_server"
    assert "--publish-to" not in plain.decode.argv


def test_the_prefill_worker_gets_the_kv_bootstrap_timeout_under_sglangs_own_name(tmp_path, monkeypatch):
    deployment = PDDeployment(DeployConfig(model_path="M", log_dir=tmp_path, kv_bootstrap_timeout_s=15),
                              is_cpu_host=True)
    env = deployment.prefill._env
    monkeypatch.setenv("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", env["SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"])
    from sglang.srt.environ import envs

    assert envs.SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT.get() == 15   # what the prefill's KV sender reads


def test_worker_env_keeps_loopback_and_disjoint_rpc_ports():
    prefill, decode = worker_env(True, 31000), worker_env(True, 31000 + NUM_TRANSFER_PORTS)
    assert prefill["SGLANG_HOST_IP"] == "127.0.0.1" and prefill["SGLANG_USE_CPU_ENGINE"] == "1"
    assert int(prefill["MC_MAX_RPC_PORT"]) < int(decode["MC_MIN_RPC_PORT"])
    assert "SGLANG_USE_CPU_ENGINE" not in worker_env(False, 31000)


@pytest.mark.parametrize("overrides, message", [
    ({"bootstrap_port": 70000}, "--bootstrap-port 70000 is not a usable TCP port"),
    ({"decode_port": 30000}, "ports must differ"),
    ({"first_transfer_port": 28950}, "^--router-metrics-port inside the transfer ports 28950-29149$"),
    ({"kv_bootstrap_timeout_s": 0}, "^--kv-bootstrap-timeout-s must be >= 1, got 0$"),
])
def test_deploy_config_names_the_bad_port(tmp_path, overrides, message):
    with pytest.raises(HarvestError, match=message):
        DeployConfig(model_path="M", log_dir=tmp_path, **overrides)


def test_bad_flags_are_one_line_errors(harvest_cli, tmp_path):
    bad = [["--port", "0"], ["--decode-port", "30000"], ["--model-path", str(tmp_path)], ["--decode-workers", "0"],
           ["--decode-workers", "2", "--admin-port", "30002"], ["--kv-bootstrap-timeout-s", "0"]]
    for flags in bad:
        proc = subprocess.run([*harvest_cli, "deploy", *flags, "--log-dir", str(tmp_path)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith("harvest deploy: error: ") and proc.stderr.count("\n") == 1, proc.stderr
        assert "Traceback" not in proc.stderr


@pytest.mark.sglang
def test_a_decode_worker_that_cannot_start_stops_the_whole_deployment(harvest_cli, tiny_model_dir, tmp_path):
    """The decode worker exits at once (a missing finetune YAML) while the prefill worker is starting: one
    line naming the decode worker and its log, exit 2, and the prefill worker stopped too (no orphan)."""
    ports = free_deploy_ports()
    flags = ["--model-path", str(tiny_model_dir), "--log-dir", str(tmp_path), "--max-total-tokens", "4096",
             "--port", str(ports[0]), "--router-metrics-port", str(ports[1]), "--prefill-port", str(ports[2]),
             "--bootstrap-port", str(ports[3]), "--decode-port", str(ports[4]), "--admin-port", str(ports[5]),
             "--first-transfer-port", str(ports[6]), "--finetune", str(tmp_path / "missing.yaml"),
             "--tpot-slo-ms", "300"]
    proc = subprocess.Popen([*harvest_cli, "deploy", *flags], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    children = []
    while proc.poll() is None and len(children) < 2:
        children = psutil.Process(proc.pid).children()
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 2, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("harvest deploy: error: decode worker (harvest serve): worker exited")
    assert "decode.log" in last
    assert "Traceback" not in stderr
    assert not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children)


def test_n_decode_workers_with_a_job_are_a_fleet_on_the_deployments_lighthouse(tmp_path):
    """--decode-workers 2 with a finetune job: two decode workers on ports +0/+1, disjoint mooncake ports, both
    behind the router, each joining the deployment's lighthouse as decode-K on shard K/2 with its own YAML copy
    (output_dir + "-K") and one shared round-checkpoint folder; every one publishes into the prefill worker."""
    import yaml

    job = write_tiny_job(tmp_path / "job", publish_every_steps=5)
    output_dir = yaml.safe_load(job.read_text())["output_dir"]
    flags = prefill_lora_flags(("--finetune", str(job)), is_cpu_host=True)
    config = DeployConfig(model_path="M", log_dir=tmp_path / "logs", decode_workers=2, lighthouse_port=29600,
                          serve_args=("--finetune", str(job), "--tpot-slo-ms", "500"), prefill_lora_flags=flags)
    deployment = PDDeployment(config, is_cpu_host=True)
    assert deployment.lighthouse.argv[-2:] == ["--bind", "127.0.0.1:29600"]
    assert [d.port for d in deployment.decodes] == [30001, 30002]
    assert [d.admin_port for d in deployment.decodes] == [30100, 30101]
    rpc = [(int(d._env["MC_MIN_RPC_PORT"]), int(d._env["MC_MAX_RPC_PORT"])) for d in deployment.decodes]
    assert rpc == [(31100, 31199), (31200, 31299)]
    router = deployment.router.argv
    assert [router[i + 1] for i, a in enumerate(router) if a == "--decode"] == [d.url for d in deployment.decodes]
    for k, decode in enumerate(deployment.decodes):
        argv = decode.argv
        assert argv[argv.index("--fleet") + 1] == "http://127.0.0.1:29600"
        assert argv[argv.index("--replica-id") + 1] == f"decode-{k}"
        assert argv[argv.index("--fleet-shard") + 1] == f"{k}/2"
        assert argv[argv.index("--fleet-checkpoint-dir") + 1] == f"{output_dir}/fleet-rounds"
        assert argv[argv.index("--publish-to") + 1] == deployment.prefill.url
        copy = yaml.safe_load(Path(argv[argv.index("--finetune") + 1]).read_text())
        assert copy == {**yaml.safe_load(job.read_text()), "output_dir": f"{output_dir}-{k}"}


def test_n_decode_workers_without_a_job_are_a_plain_pd_deployment(tmp_path):
    deployment = PDDeployment(DeployConfig(model_path="M", log_dir=tmp_path, decode_workers=3), is_cpu_host=True)
    assert deployment.lighthouse is None and len(deployment.decodes) == 3
    assert not any("--fleet" in d.argv for d in deployment.decodes)
    assert deployment.router.argv.count("--decode") == 3


@pytest.mark.parametrize("overrides, message", [
    ({"decode_workers": 0}, "^--decode-workers must be >= 1, got 0$"),
    ({"decode_workers": 2, "admin_port": 30002}, "--admin-port\\+0 and --decode-port\\+1 are both 30002"),
    ({"decode_workers": 2, "serve_args": ("--finetune", "j.yaml"), "lighthouse_port": 30010},
     "--prefill-port and --lighthouse-port are both 30010"),
    ({"decode_workers": 2, "first_transfer_port": 30050},
     "^--admin-port\\+0, --admin-port\\+1 inside the transfer ports 30050-30349$"),
    ({"decode_workers": 2, "serve_args": ("--finetune", "j.yaml", "--fleet", "http://h:1")},
     "^--fleet with --decode-workers 2: harvest deploy runs the fleet's lighthouse"),
])
def test_bad_fleet_deployments_are_named(tmp_path, overrides, message):
    with pytest.raises(HarvestError, match=message):
        DeployConfig(model_path="M", log_dir=tmp_path, **overrides)


def test_the_lighthouse_process_answers_and_stops_on_sigterm(tmp_path):
    """The deployment's lighthouse entry: torchft's LighthouseServer in its own process, /status answering,
    exit 0 on SIGTERM; a taken port is one line and exit 2."""
    import sys

    from harvest.worker.process import WorkerProcess, free_ports

    port = free_ports(1)[0]
    command = [sys.executable, "-m", "harvest.fleet.lighthouse_server", "--bind", f"127.0.0.1:{port}"]
    lighthouse = WorkerProcess([], None, 0, tmp_path / "lighthouse.log", command=command).launch()
    try:
        assert lighthouse.wait_until_ok("/status", 60, "lighthouse", port=port)
        taken = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        assert taken.returncode == 2 and taken.stderr.startswith("lighthouse: error: cannot listen on"), taken.stderr
    finally:
        assert lighthouse.stop(timeout_s=30) == 0
