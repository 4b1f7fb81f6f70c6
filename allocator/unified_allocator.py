"""UnifiedAllocator: one memory pool shared by decode KV and the finetune job (HARLI sec. 4).

Policy lives here: which chunks to lend (highest idle ids, never below the reserve), when to
lend more for an allocation, and when to take memory back
(maybe_reclaim, once per decode step, at most one finetune shrink per call).

Deferred imports: each backend is imported where it is chosen (the CUDA one binds the native CUDA VMM library).
"""

import threading
from collections.abc import Sequence
from typing import Protocol

import torch

from allocator.backend import Backend
from allocator.chunk_pool import ChunkPool, OutOfLentMemory, tensor_bytes
from allocator.config import AllocatorConfig
from base.errors import HarvestError


class KvSlots(Protocol):
    """The decode worker's token allocator (ChunkTokenToKVPoolAllocator) as the allocator sees it."""

    def available_size(self) -> int: ...

    def num_chunk_slots(self, chunk_id: int) -> int: ...

    def lendable_chunk_ids(self) -> list[int]: ...

    def withdraw_chunk(self, chunk_id: int) -> None: ...

    def restore_chunk(self, chunk_id: int) -> None: ...


def make_backend(config: AllocatorConfig) -> Backend:
    num_blocks = config.num_chunks * config.blocks_per_chunk
    if config.backend == "cuda":
        from allocator.cuda_backend import CudaBackend
        return CudaBackend(num_blocks, config.block_bytes, config.device_index)
    from allocator.host_backend import HostBackend
    return HostBackend(num_blocks, config.block_bytes)


class UnifiedAllocator:
    def __init__(self, config: AllocatorConfig, backend: Backend | None = None):
        self.config = config
        self.backend = backend or make_backend(config)
        self.chunk_pool = ChunkPool(config, self.backend)
        self.kv_slots: KvSlots | None = None
        self._owner_thread_id: int | None = None
        self.kv_demand_slots = 0
        self.num_reclaimed_chunks = 0

    def attach_kv_slots(self, kv_slots: KvSlots) -> None:
        """Called on the thread that owns the KV pool (SGLang's scheduler thread): only it lends or restores."""
        self.kv_slots = kv_slots
        self._owner_thread_id = threading.get_ident()

    @property
    def reserve_slots(self) -> int:
        return self.config.reserve_slots

    @property
    def kv_floor_slots(self) -> int:
        """Free KV slots lending never goes under and reclaim restores: the reserve plus what decode
        asked for this step (set_kv_demand)."""
        return self.config.reserve_slots + self.kv_demand_slots

    def set_kv_demand(self, num_slots: int) -> None:
        """KV slots decode needs beyond the reserve before its next step (queued requests, batch growth)."""
        if num_slots < 0:
            raise HarvestError(f"KV demand must be >= 0 slots, got {num_slots}")
        self.kv_demand_slots = num_slots

    @property
    def reserve_bytes(self) -> int:
        return self.config.reserve_bytes

    def lend_chunks(self, num_chunks: int) -> int:
        """Lend up to num_chunks all-free chunks, highest id first, keeping reserve_slots free; returns how many."""
        self._require_kv_slots()
        self._require_owner_thread("lend_chunks")
        num_lent = 0
        for chunk_id in self.kv_slots.lendable_chunk_ids():
            if num_lent == num_chunks:
                break
            # The last chunk may be partial: SGLang's pool rarely ends on a chunk boundary.
            slots_after = self.kv_slots.available_size() - self.kv_slots.num_chunk_slots(chunk_id)
            if slots_after < self.kv_floor_slots:
                break
            self.kv_slots.withdraw_chunk(chunk_id)
            self.chunk_pool.lend(chunk_id)
            num_lent += 1
        return num_lent

    def alloc_tensor(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """A tensor in lent blocks, lending more chunks if needed; OutOfLentMemory when KV can spare none."""
        num_bytes = tensor_bytes(shape, dtype)
        try:
            return self.chunk_pool.alloc_tensor(shape, dtype)
        except OutOfLentMemory:
            if self.kv_slots is None:
                raise
            if not self.is_owner_thread:  # a co-run unit: the scheduler thread lends at its next rebalance
                raise OutOfLentMemory(f"{num_bytes} bytes requested off the scheduler thread, which alone "
                                      "lends KV chunks") from None
        ledger = self.chunk_pool.ledger
        missing_blocks = ledger.blocks_needed(num_bytes) - ledger.num_free_blocks
        self.lend_chunks(-(-missing_blocks // self.config.blocks_per_chunk))
        return self.chunk_pool.alloc_tensor(shape, dtype)

    def record_stream(self, tensor: torch.Tensor, stream) -> None:
        """`stream` uses this tensor: freeing or moving it waits for the work queued there by then
        (torch's own record_stream does nothing for memory that is not torch's)."""
        self.chunk_pool.record_stream(tensor, stream)

    def record_kv_stream(self, stream) -> None:
        """A stream other than the scheduler's current one that runs KV reads/writes (SGLang's
        forward_stream under the overlap schedule): lending waits for it."""
        self.chunk_pool.record_kv_stream(stream)

    def free_tensor(self, tensor: torch.Tensor) -> None:
        self.chunk_pool.free_tensor(tensor)

    def return_idle_chunks(self, max_chunks: int | None = None) -> int:
        """Give idle lent chunks back to KV, lowest id first (new KV prefers low ids)."""
        self._require_kv_slots()
        self._require_owner_thread("return_idle_chunks")
        idle = self.chunk_pool.ledger.idle_chunk_ids()[:max_chunks]
        for chunk_id in idle:
            self.chunk_pool.reclaim(chunk_id)
            self.kv_slots.restore_chunk(chunk_id)
        self.num_reclaimed_chunks += len(idle)
        return len(idle)

    def maybe_reclaim(self, allow_drain: bool = False) -> int:
        """While free KV slots are under the floor, return an idle lent chunk, else drain the least-used one into
        free blocks of the others. Returns chunks handed back to KV; `needs_reclaim()` says if that was not
        enough (the lender then asks the job to free memory). allow_drain only where no finetune work is
        touching its tensors (between finetune units): a drain copies blocks, then remaps them."""
        self._require_kv_slots()
        num_returned = 0
        ledger = self.chunk_pool.ledger
        while self.needs_reclaim():
            if not ledger.idle_chunk_ids() and allow_drain:
                least_used = min(ledger.lent_chunk_ids(), key=lambda c: (len(ledger.used_blocks_of(c)), -c))
                self.chunk_pool.drain(least_used)
            if not ledger.idle_chunk_ids():
                break
            num_returned += self.return_idle_chunks(1)
        return num_returned

    def needs_reclaim(self) -> bool:
        """Free KV slots are under the floor while chunks are lent: decode needs lent memory back. A read of
        the KV pool, so the owner thread's only."""
        return self.kv_slots.available_size() < self.kv_floor_slots and bool(self.chunk_pool.ledger.lent_chunk_ids())

    @property
    def is_owner_thread(self) -> bool:
        return self._owner_thread_id in (None, threading.get_ident())

    def _require_owner_thread(self, verb: str) -> None:
        # SGLang frees slots on the scheduler thread (process_batch_result) with no lock: a withdraw or
        # restore of free_pages from another thread would lose those frees or hand a slot out twice.
        if not self.is_owner_thread:
            raise HarvestError(f"{verb} on thread {threading.current_thread().name!r}: only the thread that "
                               "owns the KV pool (SGLang's scheduler thread) may move KV chunks")

    def _require_kv_slots(self) -> None:
        if self.kv_slots is None:
            raise HarvestError("the allocator has no KV token allocator: call attach_kv_slots first")

    def stats(self) -> dict:
        """Counts for /harvest/stats and /metrics. Fragmentation: bytes of blocks backing tensors that no
        tensor uses (free blocks of lent chunks are lent_free_bytes, still allocatable)."""
        ledger = self.chunk_pool.ledger
        num_lent = len(ledger.lent_chunk_ids())
        chunk_bytes = self.config.blocks_per_chunk * self.config.block_bytes
        lent_bytes = num_lent * chunk_bytes
        reserved_chunks = -(-self.kv_floor_slots // self.config.slots_per_chunk)
        num_kv = self.config.num_chunks - num_lent
        used_bytes = ledger.num_used_blocks * self.config.block_bytes
        fragmentation_bytes = used_bytes - self.chunk_pool.requested_bytes
        lendable = len(self.kv_slots.lendable_chunk_ids()) if self.kv_slots is not None else 0
        return {
            "chunks_total": self.config.num_chunks,
            "chunks_kv": num_kv,
            "chunks_lent": num_lent,
            "chunks_reserved": min(reserved_chunks, num_kv),
            "chunks_free": lendable,
            "chunks_lent_idle": len(ledger.idle_chunk_ids()),
            "chunk_bytes": chunk_bytes,
            "lent_bytes": lent_bytes,
            "lent_used_bytes": used_bytes,
            "lent_free_bytes": lent_bytes - used_bytes,
            "fragmentation_bytes": fragmentation_bytes,
            "fragmentation_pct": 100.0 * fragmentation_bytes / lent_bytes if lent_bytes else 0.0,
            "reserve_bytes": self.reserve_bytes,
            "kv_demand_slots": self.kv_demand_slots,
            "num_reclaimed_chunks": self.num_reclaimed_chunks,
        }

    def close(self) -> None:
        self.chunk_pool.close()
        self.backend.close()
