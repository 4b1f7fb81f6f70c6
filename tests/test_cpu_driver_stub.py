"""The CPU driver stub built at set-up covers every driver symbol sgl_kernel needs."""

import os
import subprocess
import sys

from base.cuda_driver import STUB_RELATIVE_PATH
from base.native import REPO_ROOT, native_library


def test_stub_defines_every_undefined_driver_symbol_of_sgl_kernel():
    sys.path.insert(0, str(REPO_ROOT / "csrc" / "cpu_driver_stub"))
    from gen_symbols import undefined_driver_symbols

    needed = undefined_driver_symbols("sgl_kernel")
    stub = native_library(STUB_RELATIVE_PATH)
    defined = subprocess.run(["nm", "-D", "--defined-only", str(stub)], capture_output=True, text=True,
                             check=True).stdout
    defined_names = {line.split()[-1] for line in defined.splitlines()}
    assert {"cuGreenCtxCreate", "cuMemSetAccess"} <= needed  # the scan found the green-context and VMM calls
    assert needed <= defined_names


def test_stub_reports_no_device_and_sglang_imports():
    code = (
        "from base.cuda_driver import ensure_driver_or_stub, has_real_driver\n"
        "real = has_real_driver(); stubbed = ensure_driver_or_stub()\n"
        "import ctypes, sgl_kernel, torch\n"
        "rc = ctypes.CDLL('libcuda.so.1').cuInit(0)\n"
        "print(real, stubbed, rc, torch.cuda.is_available())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    real, stubbed, rc, cuda = out.stdout.split()[-4:]
    if real == "True":  # a GPU host: the stub must stay out of the way
        assert stubbed == "False"
    else:
        assert (stubbed, rc, cuda) == ("True", "100", "False")


def test_a_child_that_inherits_the_stub_path_still_sees_no_real_driver():
    """Pins the CI failure of 2026-11-22: once a test (or `harvest serve`) had put the stub's folder on
    LD_LIBRARY_PATH, every later child loaded the stub as `libcuda.so.1`, took it for a real driver, dropped
    the CPU defaults and died asking for mooncake. Forced here by handing the child that LD_LIBRARY_PATH."""
    stub = native_library(STUB_RELATIVE_PATH)
    code = (
        "import ctypes; from base.cuda_driver import has_real_driver, STUB_MARKER_SYMBOL\n"
        "print(hasattr(ctypes.CDLL('libcuda.so.1'), STUB_MARKER_SYMBOL), has_real_driver())\n"
    )
    env = {**os.environ, "LD_LIBRARY_PATH": f"{stub.parent}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    # The stub's folder comes first on the search path, so even a GPU host loads the stub here.
    assert out.stdout.split() == ["True", "False"]
