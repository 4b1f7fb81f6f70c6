"""The VMM round trip both allocator backends must pass (doctor's host_vmm and gpu_vmm): map four blocks
out of order, alias one at a second address, remap a slot, unmap and release."""

from collections.abc import Callable


def vmm_round_trip(backend, block: int, synchronize: Callable[[], None]) -> dict:
    """Needs 8 blocks in `backend`; `synchronize` waits for the device's writes (a no-op on the host)."""
    addr = backend.reserve(4 * block)
    backend.map_blocks(addr, [3, 1, 0, 2])
    view = backend.byte_tensor(addr, 4 * block)
    for i in range(4):
        view[i * block:(i + 1) * block].fill_(i + 1)
    alias = backend.reserve(block)
    backend.map_blocks(alias, [1])                  # block 1 sits at slot 1 of `addr` (value 2)
    alias_view = backend.byte_tensor(alias, block)
    alias_reads = bool((alias_view == 2).all())
    alias_view.fill_(9)
    synchronize()
    alias_writes = bool((view[block:2 * block] == 9).all())
    backend.unmap(alias, block)
    backend.release(alias, block)
    backend.remap_block(addr, 7)                    # slot 0: block 3 -> block 7
    view[:block].fill_(5)
    synchronize()
    remap_ok = bool((view[:block] == 5).all()) and bool((view[2 * block:3 * block] == 3).all())
    backend.unmap(addr, 4 * block)
    backend.release(addr, 4 * block)
    return {"alias_reads": alias_reads, "alias_writes": alias_writes, "remap_ok": remap_ok}
