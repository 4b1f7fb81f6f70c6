"""GPU checks of what SGLang and harvest load on a GPU besides the driver: the JIT toolchain (SGLang and
flashinfer compile several kernels with nvcc through tvm-ffi on first use), sgl_kernel's libnuma, and the
cuda-bindings that green contexts need."""

import ctypes
import importlib.metadata
import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

from harvest.doctor.check import FAIL, PASS, check_table

GPU_STACK_CHECKS, stack_check = check_table(needs_gpu=True)

MIN_CUDA_BINDINGS = (13, 0)
"""cuDevSmResourceSplitByCount / cuGreenCtxCreate as GreenPartitions calls them are in cuda-bindings >= 13.0."""
CUDA_HOME_NVCC = Path("/usr/local/cuda/bin/nvcc")


def _nvcc() -> dict:
    path = shutil.which("nvcc") or (str(CUDA_HOME_NVCC) if CUDA_HOME_NVCC.exists() else None)
    if path is None:
        return {"nvcc": None}
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"nvcc": path, "nvcc_version": f"{type(e).__name__}"}
    match = re.search(r"release (\d+\.\d+)", out)
    return {"nvcc": path, "nvcc_version": match.group(1) if match else None}


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _loads(soname: str) -> bool:
    try:
        ctypes.CDLL(soname)
    except OSError:
        return False
    return True


def _release(version: str | None) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version or "")[:2])


@stack_check(expected="nvcc found with a version (13.0 on the lent H100), tvm_ffi a version (0.1.9), libnuma true, "
                      "cuda_bindings >= 13.0",
             if_different="nvcc or tvm_ffi missing: SGLang's JIT kernels fail at the first request that needs them; "
                          "libnuma false: sgl_kernel's common_ops does not load (install libnuma1); cuda_bindings "
                          "< 13.0: no green contexts, spatial co-location cannot run")
def gpu_stack() -> dict:
    nvcc = _nvcc()
    bindings = _version("cuda-bindings")
    values = {**nvcc, "tvm_ffi": _version("apache-tvm-ffi") if importlib.util.find_spec("tvm_ffi") else None,
              "libnuma": _loads("libnuma.so.1"), "cuda_bindings": bindings}
    ok = (nvcc.get("nvcc_version") is not None and values["tvm_ffi"] is not None and values["libnuma"]
          and _release(bindings) >= MIN_CUDA_BINDINGS)
    return {"status": PASS if ok else FAIL, **values}
