"""How `harvest serve` flags become SGLang flags."""

import pytest

from base.argv import port_flag
from base.errors import HarvestError
from harvest.sglang.launcher import build_sglang_argv


def test_cpu_host_gets_cpu_defaults_unless_given():
    argv = build_sglang_argv("/m", ["--attention-backend", "triton"], is_cpu_host=True, has_job=False)
    assert argv[:4] == ["--model-path", "/m", "--disaggregation-mode", "decode"]
    assert argv.count("--attention-backend") == 1 and "triton" in argv
    assert "--disable-cuda-graph" in argv and argv[argv.index("--device") + 1] == "cpu"
    assert "--disable-overlap-schedule" in argv, "a CPU step's result must be processed before the next step"
    assert argv[argv.index("--disaggregation-transfer-backend") + 1] == "fake"


def test_gpu_host_gets_triton_fake_transfer_and_no_overlap_under_a_job():
    """The flags themselves; tests/test_gpu_twin.py checks what SGLang resolves from them on an H100."""
    lone = build_sglang_argv("/m", ["--mem-fraction-static", "0.8"], is_cpu_host=False, has_job=False)
    assert lone == ["--model-path", "/m", "--disaggregation-mode", "decode", "--mem-fraction-static", "0.8",
                    "--attention-backend", "triton", "--disaggregation-transfer-backend", "fake"]
    with_job = build_sglang_argv("/m", ["--attention-backend=flashinfer"], is_cpu_host=False, has_job=True)
    assert "triton" not in with_job and with_job.count("--disable-overlap-schedule") == 1
    deployed = build_sglang_argv("/m", ["--disaggregation-transfer-backend", "mooncake"], is_cpu_host=False,
                                 has_job=True)
    assert "fake" not in deployed


def test_only_decode_mode():
    assert "decode" in build_sglang_argv("/m", ["--disaggregation-mode=decode"], is_cpu_host=False, has_job=False)
    with pytest.raises(HarvestError, match="decode worker"):
        build_sglang_argv("/m", ["--disaggregation-mode=prefill"], is_cpu_host=False, has_job=False)


def test_sleep_on_idle_is_refused_with_a_job_and_passed_without():
    """SGLang's own idle sleep (a second a turn) would starve the job's idle units; a worker that only serves may
    have it."""
    with pytest.raises(HarvestError, match="--sleep-on-idle"):
        build_sglang_argv("/m", ["--sleep-on-idle"], is_cpu_host=True, has_job=True)
    assert "--sleep-on-idle" in build_sglang_argv("/m", ["--sleep-on-idle"], is_cpu_host=True, has_job=False)


def test_port_flag():
    assert port_flag([], "--port", 30000) == 30000
    assert port_flag(["--port=31000"], "--port", 30000) == 31000
    for bad in ["0", "65536", "-1", "x"]:
        with pytest.raises(HarvestError, match="--port"):
            port_flag(["--port", bad], "--port", 30000)
