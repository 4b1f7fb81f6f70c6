"""`harvest doctor` on a CPU host: the CPU checks run for real and pass, the GPU checks are reported skipped."""

import json
import subprocess

import pytest
import torch

from harvest.doctor import CHECKS, Check, run_checks
from harvest.doctor.check import FAIL, PASS, SKIP, check_table


def test_doctor_runs_cpu_checks_and_reports_gpu_checks_skipped(harvest_cli):
    proc = subprocess.run([*harvest_cli, "doctor", "--json"], capture_output=True, text=True, timeout=300, check=False)
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [line["check"] for line in lines] == [c.name for c in CHECKS]
    by_name = {line["check"]: line for line in lines}
    for check in CHECKS:
        line = by_name[check.name]
        assert line["expected"] and line["if_different"]
        if not check.needs_gpu:
            assert line["status"] == PASS, line
        elif not torch.cuda.is_available():
            assert line["status"] == SKIP and "no CUDA device" in line["reason"], line
    assert by_name["host_stray_read"]["outcome"] == "fault"
    assert by_name["host_kv_lend_reclaim"]["reclaimed_zeroed"] is True
    assert proc.returncode == 0, proc.stderr


def test_a_failed_gate_skips_what_depends_on_it_and_the_exit_code_says_so(harvest_cli):
    def boom():
        raise RuntimeError("no mapping")

    checks = [Check("gate", boom, "ok", "bad", gate=True), Check("after", lambda: {"status": PASS}, "ok", "bad"),
              Check("gpu", lambda: {"status": PASS}, "ok", "bad", needs_gpu=True)]
    results = run_checks(checks, lambda r: None, skip_gpu=None)
    assert [(r.check, r.status) for r in results] == [("gate", FAIL), ("after", SKIP), ("gpu", PASS)]
    assert results[0].values["error"] == "RuntimeError: no mapping"
    proc = subprocess.run([*harvest_cli, "doctor", "--only", "nope"], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2 and "unknown check(s) nope" in proc.stderr and "Traceback" not in proc.stderr



def test_a_check_table_declares_each_check_on_its_function_in_definition_order():
    """Pins what the doctor's four tables rely on since their rows moved onto the check functions: the name is
    the function's, the table's flags hold unless the check gives its own, and the order is the module's."""
    checks, check = check_table(needs_gpu=True, isolated=True)

    @check(expected="a", if_different="b", isolated=False, gate=True)
    def first() -> dict:
        return {"status": PASS}

    @check(expected="c", if_different="d")
    def second() -> dict:
        return {"status": PASS}

    assert [(c.name, c.run, c.expected, c.if_different) for c in checks] == [("first", first, "a", "b"),
                                                                              ("second", second, "c", "d")]
    assert [(c.needs_gpu, c.isolated, c.gate) for c in checks] == [(True, False, True), (True, True, False)]
    assert len({c.name for c in CHECKS}) == len(CHECKS)

@pytest.mark.gpu
def test_doctor_gpu_checks_pass_on_a_gpu(harvest_cli):
    """The checks harvest's own code must pass on a GPU (the INFO ones record the device and are not asserted)."""
    must_pass = ["gpu_stack", "gpu_env", "gpu_native", "gpu_vmm", "gpu_stray_read", "gpu_unmap_inflight_kernel",
                 "gpu_unmap_inflight_dma", "gpu_kv_lend_reclaim", "gpu_swap_evict", "gpu_split", "gpu_handoff"]
    proc = subprocess.run([*harvest_cli, "doctor", "--json", "--only", ",".join(must_pass)], capture_output=True,
                          text=True, timeout=1800, check=False)
    lines = {line["check"]: line for line in map(json.loads, proc.stdout.splitlines())}
    assert {name: lines[name]["status"] for name in must_pass} == dict.fromkeys(must_pass, PASS), proc.stdout


@pytest.mark.parametrize("record_only, status", [(True, "INFO"), (False, FAIL)])
def test_an_isolated_check_whose_process_dies_keeps_the_error_and_the_frame(monkeypatch, record_only, status):
    """On the H100 the raw unmap under a copy aborted its process and the doctor kept only the last 600
    characters of a C++ backtrace, not the error. A record-only probe's death is its finding (INFO)."""
    from harvest.doctor import runner

    stderr = "terminate called after throwing 'c10::Error': CUDA error: an illegal memory access\n" + "frame\n" * 400
    died = subprocess.CompletedProcess(args=[], returncode=-6, stdout="", stderr=stderr)
    monkeypatch.setattr(runner.subprocess, "run", lambda *a, **k: died)
    check = Check("probe", dict, expected="", if_different="", isolated=True, record_only=record_only)
    values = runner._run_isolated(check)
    assert values["status"] == status and values["returncode"] == -6
    assert values["stderr"].startswith("terminate called") and values["stderr"].endswith("frame\n")
    assert len(values["stderr"]) < len(stderr)
