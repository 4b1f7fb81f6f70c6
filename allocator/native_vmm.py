"""Loading csrc/vmm's libraries with ctypes and turning their return codes into exceptions."""

import ctypes
import errno
import os
from functools import cache

from base.native import native_library

HOST_LIBRARY = "vmm/libharvest_vmm_host.so"
CUDA_LIBRARY = "vmm/libharvest_vmm_cuda.so"

_u64 = ctypes.c_uint64
_i64 = ctypes.c_int64
_u64_p = ctypes.POINTER(ctypes.c_uint64)
_i64_p = ctypes.POINTER(ctypes.c_int64)

_HOST_SIGNATURES = {
    "hv_reserve": [_u64, _u64_p],
    "hv_release": [_u64, _u64],
    "hv_create": [_u64, _i64_p],
    "hv_destroy": [_i64],
    "hv_unmap": [_u64, _u64],
    "hv_map_blocks": [_u64, _u64, _i64, _u64_p, _i64],
    "hv_unmap_blocks": [_u64_p, _i64, _u64],
    "hv_map_blocks_at": [_u64_p, _u64, _i64, _u64_p, _i64],
    "hv_page_bytes": [_u64_p],
    "hv_zero": [_u64, _u64],
}
_CUDA_SIGNATURES = {
    "hc_init": [ctypes.c_int],
    "hc_granularity": [ctypes.c_int, _u64_p],
    "hc_reserve": [_u64, _u64, _u64_p],
    "hc_release": [_u64, _u64],
    "hc_create_blocks": [_u64, ctypes.c_int, _u64_p, _i64],
    "hc_destroy_blocks": [_u64_p, _i64],
    "hc_unmap": [_u64, _u64, _u64],
    "hc_map_blocks": [_u64, _u64, _u64_p, _i64, ctypes.c_int],
    "hc_unmap_blocks": [_u64_p, _i64, _u64],
    "hc_map_blocks_at": [_u64_p, _u64, _u64_p, _i64, ctypes.c_int],
    "hc_rdma_capable": [ctypes.c_int, ctypes.POINTER(ctypes.c_int)],
}
_CUDA_CODES = {100: "CUDA_ERROR_NO_DEVICE", 2: "CUDA_ERROR_OUT_OF_MEMORY", 1: "CUDA_ERROR_INVALID_VALUE",
               3: "CUDA_ERROR_NOT_INITIALIZED", 100000: "libcuda.so.1 not found",
               100001: "driver lacks a cuMem* entry point", 100002: "hc_init was not called or failed"}


class VmmError(RuntimeError):
    """A syscall or driver call in csrc/vmm failed; the message names the C entry point and the code."""

    def __init__(self, call: str, code: int, reason: str):
        super().__init__(f"{call} failed: {reason} (code {code})")
        self.call = call
        self.code = code


def check_host(call: str, code: int) -> None:
    if code:
        raise VmmError(call, code, f"{errno.errorcode.get(code, '?')}: {os.strerror(code)}")


def check_cuda(call: str, code: int) -> None:
    if code:
        raise VmmError(call, code, _CUDA_CODES.get(code, "CUresult"))


def u64_array(values) -> ctypes.Array:
    values = list(values)
    return (ctypes.c_uint64 * len(values))(*values)


@cache
def host_library() -> ctypes.CDLL:
    return _load(HOST_LIBRARY, _HOST_SIGNATURES)


@cache
def cuda_library() -> ctypes.CDLL:
    return _load(CUDA_LIBRARY, _CUDA_SIGNATURES)


def _load(relative_path: str, signatures: dict) -> ctypes.CDLL:
    library = ctypes.CDLL(str(native_library(relative_path)))
    for name, argtypes in signatures.items():
        function = getattr(library, name)
        function.argtypes = argtypes
        function.restype = ctypes.c_int
    return library
