"""The GPU twin: SGLang's own `ServerArgs` resolution run on the argv harvest builds, with torch's device facts
patched to an H100's, so a flag that crashes the first GPU run fails here. No worker starts.

Each test goes through the real CLI (`harvest serve`, or the decode and prefill command lines `harvest deploy`
builds) up to the point where the supervisor would start SGLang, and asserts on the resolved `ServerArgs`.
"""

import contextlib
import os
import types
from unittest import mock

import pytest

from base.cuda_driver import ensure_driver_or_stub
from harvest.bundle.wheel_repack import sglang_kernel_drop
from harvest.config import Colocation, colocation_mode
from harvest.deploy import DeployConfig
from harvest.deploy.pd_deployment import PDDeployment, free_deploy_ports
from harvest.finetune import llamafactory_args
from harvest.finetune.demo.tiny_job import write_tiny_job
from harvest.worker.process import free_ports

H100 = types.SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0, multi_processor_count=132,
                             total_memory=81559 * 2**20, L2_cache_size=50 * 2**20)
"""As the lent H100 reported itself (KINDS.md): 81559 MiB, 132 SMs, capability 9.0."""

# Attention backends whose kernels live in an sgl_kernel file, and that file: the bundle must keep it.
BACKEND_FILES = {"fa3": "sgl_kernel/flash_ops.abi3.so", "flashmla": "sgl_kernel/flashmla_ops.abi3.so"}


def _clear_sglang_device_caches() -> None:
    from sglang.srt.utils import common

    for value in vars(common).values():
        if hasattr(value, "cache_clear"):  # is_cuda, is_hopper_with_cuda_12_3, ... are lru_cached
            value.cache_clear()


def _off_device(fn, *args):
    import torch

    with mock.patch.object(torch.cuda, "is_available", lambda: False):
        return fn(*args)


@contextlib.contextmanager
def h100():
    """torch and the driver look like one H100 with CUDA 13.0 (torch 2.11.0+cu130, as on the lent host)."""
    ensure_driver_or_stub()  # sgl_kernel links libcuda.so.1; it imports here as on a CPU host, before the patch
    import sglang.srt.server_args  # noqa: F401
    import torch
    from sglang.srt.utils import common

    facts = {"is_available": lambda: True, "device_count": lambda: 1, "current_device": lambda: 0,
             "get_device_capability": lambda device=None: (H100.major, H100.minor),
             "get_device_properties": lambda device=None: H100, "get_device_name": lambda device=None: H100.name,
             "mem_get_info": lambda device=None: (H100.total_memory - 2**30, H100.total_memory)}
    with contextlib.ExitStack() as stack:
        for name, fact in facts.items():
            stack.enter_context(mock.patch.object(torch.cuda, name, fact))
        stack.enter_context(mock.patch.object(torch.version, "cuda", "13.0"))
        # SGLang asks nvidia-smi for the memory (MiB); there is none here.
        stack.enter_context(mock.patch.object(common, "get_nvgpu_memory_capacity", lambda: H100.total_memory / 2**20))
        stack.enter_context(mock.patch("base.cuda_driver.has_real_driver", lambda: True))
        stack.enter_context(mock.patch("base.cuda_driver.ensure_driver_or_stub", lambda: False))
        # LlamaFactory's TrainingArguments set up the CUDA device when they parse the job: the twin resolves
        # SGLang's configuration, not the trainer's, so the job is parsed as on this host.
        parse_job = llamafactory_args._parse
        stack.enter_context(mock.patch.object(llamafactory_args, "_parse", lambda raw: _off_device(parse_job, raw)))
        # A GPU host runs SGLang's CUDA engine: the CPU engine's switch (set by CPU tests in this process) is off.
        stack.enter_context(mock.patch.dict(os.environ))
        os.environ.pop("SGLANG_USE_CPU_ENGINE", None)
        _clear_sglang_device_caches()
        stack.callback(_clear_sglang_device_caches)
        yield


def serve_on_h100(argv: list[str], monkeypatch) -> tuple:
    """`harvest serve ARGV` as on an H100, stopped where the supervisor would start SGLang: (ServerArgs, ServeConfig)."""
    from harvest.cli.main import main

    monkeypatch.setenv("LD_LIBRARY_PATH", "")  # serve adds the system libraries' folder to it
    started = []
    with h100(), mock.patch("harvest.worker.supervisor.supervise",
                            lambda launch, server_args, config, _: started.append((server_args, config)) or 0):
        assert main(["serve", *argv]) == 0
    assert len(started) == 1
    return started[0]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return write_tiny_job(tmp_path_factory.mktemp("twin"))


@pytest.fixture(scope="module")
def model(job):
    import yaml

    return yaml.safe_load(job.read_text())["model_name_or_path"]


def _deploy_config(model: str, log_dir, serve_args: tuple[str, ...] = ()) -> DeployConfig:
    ports = dict(zip(["router_port", "router_metrics_port", "prefill_port", "bootstrap_port", "decode_port",
                      "admin_port", "first_transfer_port"], free_deploy_ports()))
    return DeployConfig(model_path=model, log_dir=log_dir, serve_args=serve_args, **ports)


def _ports() -> list[str]:
    port, admin_port = free_ports(2)
    return ["--port", str(port), "--admin-port", str(admin_port)]


def assert_no_problems(*args, **kwargs) -> None:
    found = problems(*args, **kwargs)
    assert not found, "; ".join(found)


def problems(server_args, transfer_backend: str, is_overlap_off: bool | None = None) -> list[str]:
    """What would break the first GPU run, each in a line (all of them, so one run names every defect):
    an attention backend whose kernels the bundle strips (FA3's flash_ops) or that is not triton (the one
    that needs no nvcc and no sgl_kernel file), the wrong transfer engine, the overlap schedule under a job."""
    found = []
    backends = {server_args.attention_backend, server_args.decode_attention_backend,
                server_args.prefill_attention_backend} - {None}
    dropped = sglang_kernel_drop("sm90")
    found += [f"attention {b}: {BACKEND_FILES[b]} is not in the bundle" for b in backends
              if b in BACKEND_FILES and dropped(BACKEND_FILES[b])]
    if backends != {"triton"}:
        found.append(f"attention backends {sorted(backends)}, expected triton")
    if server_args.disaggregation_transfer_backend != transfer_backend:
        found.append(f"transfer backend {server_args.disaggregation_transfer_backend}, expected {transfer_backend}")
    if is_overlap_off is not None and server_args.disable_overlap_schedule != is_overlap_off:
        found.append(f"disable_overlap_schedule {server_args.disable_overlap_schedule}, expected {is_overlap_off}")
    return found


def test_lone_worker_without_a_job(model, monkeypatch):
    server_args, config = serve_on_h100(["--model-path", model, *_ports()], monkeypatch)
    assert config.finetune is None and server_args.device == "cuda"
    # A lone worker has no prefill worker to pull KV from: fake; mooncake is not in the bundle.
    assert_no_problems(server_args, "fake")


@pytest.mark.parametrize("mode", [["--colocation", "temporal"], [], ["--pin-partition", "64,64"]],
                         ids=["temporal", "spatial-chosen", "spatial-pinned"])
def test_lone_worker_with_a_job(model, job, mode, monkeypatch):
    server_args, config = serve_on_h100(
        ["--model-path", model, "--finetune", str(job), "--tpot-slo-ms", "40", *mode, *_ports()], monkeypatch)
    assert config.finetune is not None and config.pinned_partition == ((64, 64) if "--pin-partition" in mode else None)
    assert colocation_mode(config, None) is (Colocation.TEMPORAL if "temporal" in mode else Colocation.SPATIAL)
    # before_step(n) / after_step(n) pair only without the overlap schedule.
    assert_no_problems(server_args, "fake", is_overlap_off=True)


def test_user_flags_win(model, monkeypatch):
    server_args, _ = serve_on_h100(["--model-path", model, "--attention-backend", "flashinfer",
                                    "--disaggregation-transfer-backend", "nixl", *_ports()], monkeypatch)
    assert server_args.attention_backend == "flashinfer" and server_args.disaggregation_transfer_backend == "nixl"


@pytest.mark.parametrize("mode", ["no-job", "temporal", "spatial"])
def test_under_deploy(model, job, mode, tmp_path, monkeypatch):
    """The decode worker `harvest deploy` starts (its `harvest serve` argv) and its prefill worker."""
    with_job = mode != "no-job"
    serve_args = ("--finetune", str(job), "--tpot-slo-ms", "40") if with_job else ()
    serve_args += {"temporal": ("--colocation", "temporal"), "spatial": ("--pin-partition", "64,64")}.get(mode, ())
    config = _deploy_config(model, tmp_path, serve_args)
    deployment = PDDeployment(config, is_cpu_host=False)
    decode_argv = deployment.decode.argv
    assert decode_argv[1:4] == ["-m", "harvest.cli.main", "serve"]
    server_args, serve_config = serve_on_h100(decode_argv[4:], monkeypatch)
    assert (serve_config.pinned_partition is not None) == (mode == "spatial")
    assert_no_problems(server_args, "mooncake", is_overlap_off=True if with_job else None)

    from harvest.sglang.launcher import parse_sglang_args

    prefill_argv = deployment.prefill.argv
    assert prefill_argv[1:3] == ["-m", "sglang.launch_server"]
    with h100():
        prefill_args = parse_sglang_args(prefill_argv[3:])
    assert_no_problems(prefill_args, "mooncake")


def test_a_host_without_xgrammar_gets_no_grammar_backend(model, monkeypatch):
    """The GPU bundle leaves xgrammar out; SGLang's default grammar backend imports it at scheduler start, so
    where it is missing harvest asks for none, and SGLang's own resolution keeps it."""
    import importlib.util

    find_spec = importlib.util.find_spec
    server_args, _ = serve_on_h100(["--model-path", model, *_ports()], monkeypatch)
    assert server_args.grammar_backend == "xgrammar"  # installed here: SGLang's default stays
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "xgrammar" else find_spec(name, *a))
    server_args, _ = serve_on_h100(["--model-path", model, *_ports()], monkeypatch)
    assert server_args.grammar_backend == "none"
    assert_no_problems(server_args, "fake")


def test_deploy_needs_mooncake_installed(model, tmp_path, monkeypatch):
    """Pins that `harvest deploy` names a missing mooncake in one line before starting anything (the GPU bundle
    carries none), forced by hiding the module."""
    import importlib.util

    from base.errors import HarvestError
    from harvest.deploy.pd_deployment import prepare_deployment

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mooncake" else find_spec(name, *a))
    with pytest.raises(HarvestError, match="mooncake is not installed"):
        prepare_deployment(_deploy_config(model, tmp_path))
