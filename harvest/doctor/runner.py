"""Runs the doctor's checks in order: CPU checks everywhere, GPU checks where torch sees a GPU (skipped
with the reason otherwise), the ones that may kill the CUDA context in a subprocess of their own.

`python -m harvest.doctor.runner NAME` runs one check and prints its values as one JSON line.

Deferred imports: torch, the CUDA bindings and the allocator are imported by the checks that use them, so a host without
a GPU stack still gets its report.
"""

import json
import os
import subprocess
import sys
from collections.abc import Callable

from harvest.doctor.check import FAIL, INFO, SKIP, Check, CheckResult
from harvest.doctor.gpu_memory_checks import GPU_MEMORY_CHECKS
from harvest.doctor.gpu_partition_checks import GPU_PARTITION_CHECKS
from harvest.doctor.gpu_stack_checks import GPU_STACK_CHECKS
from harvest.doctor.host_checks import HOST_CHECKS

CHECKS: list[Check] = HOST_CHECKS + GPU_STACK_CHECKS + GPU_MEMORY_CHECKS + GPU_PARTITION_CHECKS
ISOLATED_TIMEOUT_S = 300


def gpu_skip_reason() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    return None


def run_checks(checks: list[Check], emit: Callable[[CheckResult], None], skip_gpu: str | None = None) -> list:
    """Every check in order; emit each result as it is known. skip_gpu: the reason GPU checks cannot run."""
    results, failed_gate = [], {}
    for check in checks:
        reason = skip_gpu if check.needs_gpu else None
        reason = reason or failed_gate.get(check.needs_gpu)
        if reason:
            values = {"status": SKIP, "reason": reason}
        else:
            values = _run_isolated(check) if check.isolated else _run_here(check)
        result = CheckResult(check.name, values.pop("status"), check.expected, check.if_different, values)
        if check.gate and result.status == FAIL:
            failed_gate[check.needs_gpu] = f"{check.name} failed; this check depends on it"
        results.append(result)
        emit(result)
    return results


def _run_here(check: Check) -> dict:
    try:
        return check.run()
    except Exception as e:  # noqa: BLE001 - a check's exception is its finding
        return {"status": FAIL, "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}


def _run_isolated(check: Check) -> dict:
    try:
        proc = subprocess.run([sys.executable, "-m", "harvest.doctor.runner", check.name], capture_output=True, check=False,
                              text=True, timeout=ISOLATED_TIMEOUT_S, env=os.environ.copy())
    except subprocess.TimeoutExpired:
        return {"status": FAIL, "error": f"timed out after {ISOLATED_TIMEOUT_S} s (a hang)"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"status": INFO if check.record_only else FAIL, "outcome": "process died",
                "returncode": proc.returncode, "stderr": _head_and_tail(proc.stderr)}
    return json.loads(lines[-1])


def _head_and_tail(text: str, keep: int = 600) -> str:
    """The error is at the head of a crash's stderr, the frame that raised it at the tail."""
    return text if len(text) <= 2 * keep else f"{text[:keep]} [...] {text[-keep:]}"


def _main(name: str) -> int:
    check = next((c for c in CHECKS if c.name == name), None)
    if check is None:
        print(f"no doctor check named {name!r}", file=sys.stderr)
        return 2
    print(json.dumps(_run_here(check), default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1]))
