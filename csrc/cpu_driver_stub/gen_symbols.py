"""Print `STUB(cuName)` for every CUDA driver symbol that sgl_kernel's shared objects leave undefined."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

DRIVER_SYMBOL = re.compile(r"^cu[A-Z]\w*$")  # versioned names (cudaX@libcudart) belong to other libraries


def undefined_driver_symbols(package: str) -> set[str]:
    spec = importlib.util.find_spec(package)  # locate without importing: the import is what fails
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"gen_symbols: package {package!r} is not installed")
    names = set()
    for shared_object in Path(next(iter(spec.submodule_search_locations))).rglob("*.so"):
        out = subprocess.run(
            ["nm", "-D", "--undefined-only", str(shared_object)], check=True, capture_output=True, text=True
        ).stdout
        names.update(line.split()[-1] for line in out.splitlines() if DRIVER_SYMBOL.match(line.split()[-1]))
    return names


if __name__ == "__main__":
    # cuInit / cuDriverGetVersion / cuGetProcAddress are what torch and cuda-python probe first.
    symbols = undefined_driver_symbols("sgl_kernel") | {"cuInit", "cuDriverGetVersion", "cuGetProcAddress_v2"}
    print("\n".join(f"STUB({name})" for name in sorted(symbols)))
