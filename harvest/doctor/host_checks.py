"""Checks that run on any host: the stack, the native libraries and the host backend of the allocator.

Deferred imports: torch, the CUDA bindings and the allocator are imported by the checks that use them, so a host without
a GPU stack still gets its report.
"""

import importlib.metadata
import platform
import signal
import subprocess
import sys

from base.native import NATIVE_BUILD_DIR
from harvest.doctor.check import FAIL, PASS, check_table
from harvest.doctor.kv_round_trip import kv_lend_reclaim
from harvest.doctor.vmm_round_trip import vmm_round_trip
from harvest.sglang.version import PINNED_STACK

HOST_CHECKS, host_check = check_table()

PINNED = {name: PINNED_STACK[name] for name in ("torch", "sglang", "transformers", "llamafactory")}
PAGE_BLOCK_BYTES = 64 << 10


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


@host_check(gate=True,
            expected=", ".join(f"{k} {v}" for k, v in PINNED.items()) + ", host_library true",
            if_different="A stack other than the pinned one, or csrc/ not built (`make setup`): stop here")
def host_env() -> dict:
    import torch

    from allocator.native_vmm import CUDA_LIBRARY, HOST_LIBRARY
    from base.cuda_driver import has_real_driver  # deferred: test_gpu_twin's H100 stand-in patches it

    versions = {name: _version(name) for name in PINNED}
    stack_ok = all((versions[name] or "").split("+")[0] == pin for name, pin in PINNED.items())
    host_library = (NATIVE_BUILD_DIR / HOST_LIBRARY).exists()
    return {"status": PASS if stack_ok and host_library else FAIL, "python": platform.python_version(),
            **versions, "torch_cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
            "real_driver": has_real_driver(), "host_library": host_library,
            "cuda_library": (NATIVE_BUILD_DIR / CUDA_LIBRARY).exists()}


@host_check(gate=True,
            expected="alias_reads, alias_writes, remap_ok all true",
            if_different="hv_map_blocks/hv_unmap (csrc/vmm/vmm_host.c) map the wrong pages: KV and finetune "
                         "bytes would mix")
def host_vmm() -> dict:
    """HostBackend map / alias / remap through libharvest_vmm_host.so (memfd + mmap)."""
    from allocator.host_backend import HostBackend

    block = PAGE_BLOCK_BYTES
    backend = HostBackend(8, block)
    try:
        checks = vmm_round_trip(backend, block, synchronize=lambda: None)
    finally:
        backend.close()
    return {"status": PASS if all(checks.values()) else FAIL, **checks}


_STRAY_READ = """
from allocator.host_backend import HostBackend
backend = HostBackend(1, {block})
addr = backend.reserve({block})
backend.map_blocks(addr, [0])
view = backend.byte_tensor(addr, {block})
backend.unmap(addr, {block})                            # what lending does to a KV chunk's range
print(int(view.sum()))
"""


@host_check(expected="outcome fault (SIGSEGV): a lent KV range is unmapped",
            if_different="A stray KV read of a lent chunk would return bytes instead of failing loudly")
def host_stray_read() -> dict:
    """A read of an unmapped (lent) range must kill the process, never return bytes."""
    proc = subprocess.run([sys.executable, "-c", _STRAY_READ.format(block=PAGE_BLOCK_BYTES)],
                          capture_output=True, text=True, timeout=120, check=False)
    faulted = proc.returncode in (-signal.SIGSEGV, -signal.SIGBUS)
    return {"status": PASS if faulted else FAIL, "returncode": proc.returncode,
            "outcome": "fault" if faulted else f"returned {proc.stdout.strip()!r}"}


@host_check(expected="filled, live_kv_intact, reclaimed_zeroed all true",
            if_different="ChunkPool lend/reclaim maps the wrong blocks (live KV overwritten) or leaks "
                         "finetune bytes into reclaimed KV")
def host_kv_lend_reclaim() -> dict:
    """KV bytes of live chunks survive lending, tensor use and reclaim of other chunks; reclaimed chunks read zero."""
    from allocator.config import AllocatorConfig

    config = AllocatorConfig(num_layers=2, kv_row_bytes=4 * 16 * 2, num_chunks=6, block_bytes=PAGE_BLOCK_BYTES)
    return kv_lend_reclaim(config, (4, 16), "cpu")
