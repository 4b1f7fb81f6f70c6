"""Make `import sgl_kernel` work on hosts with no NVIDIA driver, without touching real GPU hosts."""

import ctypes
import os

from base.native import native_library

STUB_RELATIVE_PATH = "cpu_driver_stub/libcuda.so.1"
STUB_MARKER_SYMBOL = "harvest_cpu_driver_stub"


def has_real_driver() -> bool:
    """True if `libcuda.so.1` loads and is not harvest's stub (a process that inherited the stub's folder
    on LD_LIBRARY_PATH from a parent finds the stub under the driver's name)."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return not hasattr(driver, STUB_MARKER_SYMBOL)


def ensure_driver_or_stub() -> bool:
    """Load the CPU driver stub when no real libcuda.so.1 exists; True if the stub is in use.

    The loader satisfies sgl_kernel's DT_NEEDED libcuda.so.1 with an already loaded library of that
    soname, so preloading with RTLD_GLOBAL covers this process; LD_LIBRARY_PATH covers the SGLang
    subprocesses, whose loader reads it at exec.
    """
    if has_real_driver():
        return False
    stub = native_library(STUB_RELATIVE_PATH)
    ctypes.CDLL(str(stub), mode=ctypes.RTLD_GLOBAL)
    search_path = os.environ.get("LD_LIBRARY_PATH", "")
    if str(stub.parent) not in search_path.split(":"):
        os.environ["LD_LIBRARY_PATH"] = f"{stub.parent}:{search_path}" if search_path else str(stub.parent)
    return True
