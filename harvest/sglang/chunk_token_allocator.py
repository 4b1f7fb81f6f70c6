"""ChunkTokenToKVPoolAllocator: SGLang's page_size-1 token allocator, aware of lent chunks.

Slot s lives in chunk s // slots_per_chunk. A lent chunk's slots leave free_pages (so alloc never
hands them out and available_size shrinks by them) and come back, sorted, when it is restored. Frees
always go to release_pages and alloc merges and sorts them in whenever one of them is among the
lowest free ids, so new KV always takes the lowest slot ids and high chunks drain and become lendable
(SGLang's PD-decode sorting, applied at every alloc).
"""

import threading

import torch
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator

from base.errors import HarvestError


class ChunkTokenToKVPoolAllocator(TokenToKVPoolAllocator):
    def __init__(self, size: int, dtype: torch.dtype, device: str, kvcache, need_sort: bool,
                 slots_per_chunk: int):
        if slots_per_chunk <= 0:
            raise HarvestError(f"slots_per_chunk must be positive, got {slots_per_chunk}")
        self.slots_per_chunk = slots_per_chunk
        self.num_chunks = -(-(size + 1) // slots_per_chunk)
        self.lent_chunk_ids: set[int] = set()
        self._owner_thread_id = threading.get_ident()   # SGLang's scheduler thread builds the pool
        super().__init__(size, dtype, device, kvcache, need_sort)

    def clear(self):
        super().clear()
        if self.lent_chunk_ids:
            self.free_pages = self.free_pages[~self._in_lent_chunk(self.free_pages)]

    def alloc(self, need_size: int):
        # On CPU, sort only when a released slot would be among the need_size lowest (a full sort of a
        # 100k-slot pool costs milliseconds there). On a GPU that test is a device-to-host sync on every
        # token allocation; the sort itself is queued without one, so it always runs.
        if len(self.release_pages) > 0 and need_size > 0 and (
                self.free_pages.is_cuda or need_size > len(self.free_pages)
                or bool(self.release_pages.min() < self.free_pages[need_size - 1])):
            self.merge_and_sort_free()
        return super().alloc(need_size)

    def free(self, free_index: torch.Tensor):
        if free_index.numel() == 0:
            return
        if self.is_not_in_free_group:
            self.release_pages = torch.cat((self.release_pages, free_index))
        else:
            self.free_group.append(free_index)

    def chunk_slots(self, chunk_id: int) -> torch.Tensor:
        """The slot ids of chunk_id that exist in this pool (slot 0 and slots past size do not)."""
        first = max(1, chunk_id * self.slots_per_chunk)
        last = min(self.size, (chunk_id + 1) * self.slots_per_chunk - 1)
        return torch.arange(first, last + 1, dtype=torch.int64, device=self.device)

    def num_free_slots_per_chunk(self) -> torch.Tensor:
        self.merge_and_sort_free()
        # free_pages is sorted: a chunk's free slots lie between two searchsorted bounds.
        bounds = torch.arange(self.num_chunks + 1, dtype=torch.int64, device=self.device) * self.slots_per_chunk
        index = torch.searchsorted(self.free_pages, bounds)
        return index[1:] - index[:-1]

    def lendable_chunk_ids(self) -> list[int]:
        """Chunks with every slot free, highest id first; chunk 0 holds the padded slot 0 and never lends."""
        free_counts = self.num_free_slots_per_chunk().tolist()
        return [c for c in range(self.num_chunks - 1, 0, -1)
                if c not in self.lent_chunk_ids and free_counts[c] == self.num_chunk_slots(c)]

    def num_chunk_slots(self, chunk_id: int) -> int:
        """len(chunk_slots(chunk_id)), without making a device tensor."""
        first = max(1, chunk_id * self.slots_per_chunk)
        return max(0, min(self.size, (chunk_id + 1) * self.slots_per_chunk - 1) - first + 1)

    def withdraw_chunk(self, chunk_id: int) -> None:
        """Take every slot of an all-free chunk out of circulation (before its memory is lent)."""
        self._require_owner_thread("withdraw_chunk", chunk_id)
        if chunk_id in self.lent_chunk_ids or not 0 < chunk_id < self.num_chunks:
            raise HarvestError(f"chunk {chunk_id} cannot be withdrawn: lent already or out of range")
        self.merge_and_sort_free()
        slots = self.chunk_slots(chunk_id)
        # free_pages is sorted, so the chunk's slots are one contiguous run of it.
        lo, hi = torch.searchsorted(self.free_pages, slots[[0, -1]]).tolist()
        found = self.free_pages[[lo, hi]].tolist() if hi < len(self.free_pages) else []
        if hi - lo + 1 != len(slots) or found != slots[[0, -1]].tolist():
            raise HarvestError(f"chunk {chunk_id} cannot be withdrawn: some of its slots hold KV")
        self.free_pages = torch.cat((self.free_pages[:lo], self.free_pages[hi + 1:]))
        self.lent_chunk_ids.add(chunk_id)

    def restore_chunk(self, chunk_id: int) -> None:
        """Put a reclaimed chunk's slots back into free_pages, in slot order."""
        self._require_owner_thread("restore_chunk", chunk_id)
        if chunk_id not in self.lent_chunk_ids:
            raise HarvestError(f"chunk {chunk_id} is not lent")
        self.lent_chunk_ids.discard(chunk_id)
        self.merge_and_sort_free()
        slots = self.chunk_slots(chunk_id)
        at = int(torch.searchsorted(self.free_pages, slots[0]))
        self.free_pages = torch.cat((self.free_pages[:at], slots, self.free_pages[at:]))

    def _require_owner_thread(self, verb: str, chunk_id: int) -> None:
        # free() runs on the scheduler thread with no lock; free_pages changed from another thread loses
        # frees or hands a slot out twice.
        if threading.get_ident() != self._owner_thread_id:
            raise HarvestError(f"{verb}({chunk_id}) on thread {threading.current_thread().name!r}: only SGLang's "
                               "scheduler thread, which owns the KV pool, may touch KV slots")

    @property
    def num_lent_slots(self) -> int:
        """Slots out of circulation; SGLang's idle leak check must count them as available."""
        return sum(self.num_chunk_slots(c) for c in self.lent_chunk_ids)

    def _in_lent_chunk(self, slots: torch.Tensor) -> torch.Tensor:
        lent = torch.tensor(sorted(self.lent_chunk_ids), dtype=torch.int64, device=self.device)
        return torch.isin(slots // self.slots_per_chunk, lent)
