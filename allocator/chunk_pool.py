"""ChunkPool: per-layer K/V buffers over physical chunks, and tensors over the blocks of lent chunks.

VA layout: buffer b = 2 * layer + (0 for K, 1 for V) is the contiguous range kv_base + b * chunk_span,
chunk_span = num_chunks * block_bytes, and block (c, b) is mapped at offset c * block_bytes of it, so
SGLang indexes ordinary [num_slots, heads, head_dim] tensors. Lending chunk c unmaps its block from
every buffer: a stray KV access to a lent chunk faults instead of reading finetune data.

Unmapping is a host call, not ordered on any stream, and torch's record_stream does nothing for these
tensors (their storage is not torch's). So the pool keeps its own record: the streams that used each
tensor (record_stream) and the streams that touch the KV buffers (record_kv_stream); before it unmaps or
moves a range it waits for the work queued on them so far.
A PD transfer lands only in slots the decode scheduler has already allocated, so its chunk is never
all-free and never lendable: slot accounting keeps lending off a landing transfer, no pin is needed.
"""

import math
from collections.abc import Sequence

import torch

from allocator.backend import Backend
from allocator.chunk_ledger import ChunkLedger, ChunkState
from allocator.config import AllocatorConfig
from base.errors import HarvestError

ALIGN_BYTES = 512  # every tensor starts 512-byte aligned, as torch's CUDA caching allocator does


class OutOfLentMemory(MemoryError):
    """Too few free blocks in lent chunks for this allocation right now (lend more, or wait)."""


class ChunkPool:
    def __init__(self, config: AllocatorConfig, backend: Backend):
        self.config = config
        self.backend = backend
        self.block_bytes = config.block_bytes
        self.ledger = ChunkLedger(config.num_chunks, config.blocks_per_chunk, config.block_bytes)
        self.chunk_span_bytes = config.num_chunks * config.block_bytes
        self.kv_base = backend.reserve(config.blocks_per_chunk * self.chunk_span_bytes)
        for buffer_id in range(config.blocks_per_chunk):
            block_ids = [c * config.blocks_per_chunk + buffer_id for c in range(config.num_chunks)]
            backend.map_blocks(self._buffer_addr(buffer_id), block_ids)
        self._tensors: dict[int, tuple[int, int, int, int]] = {}  # data_ptr -> (owner, addr, mapped, requested)
        self._next_owner = 0
        self._addr_of_owner: dict[int, int] = {}
        self._users: dict[int, list] = {}           # owner -> streams that used its tensor
        self._kv_streams: list = []

    def _buffer_addr(self, buffer_id: int) -> int:
        return self.kv_base + buffer_id * self.chunk_span_bytes

    def kv_buffer(self, layer_id: int, is_value: bool) -> torch.Tensor:
        """uint8 view of one layer's K or V range: num_chunks * block_bytes bytes."""
        return self.backend.byte_tensor(self._buffer_addr(2 * layer_id + int(is_value)), self.chunk_span_bytes)

    def kv_buffers(self, num_rows: int, row_shape: Sequence[int], dtype: torch.dtype) -> tuple[list, list]:
        """SGLang's k_buffer / v_buffer lists: per layer [num_rows, *row_shape] views of the chunks."""
        row_bytes = math.prod(row_shape) * torch.empty((), dtype=dtype).element_size()
        if row_bytes != self.config.kv_row_bytes or num_rows > self.config.num_slots:
            raise HarvestError(f"KV rows of {row_bytes} bytes x {num_rows} do not fit the pool's "
                               f"{self.config.kv_row_bytes}-byte rows x {self.config.num_slots} slots")
        buffers = ([], [])
        for layer_id in range(self.config.num_layers):
            for is_value in (False, True):
                raw = self.kv_buffer(layer_id, is_value)[: num_rows * row_bytes]
                buffers[is_value].append(raw.view(dtype).view(num_rows, *row_shape))
        return buffers

    def state(self, chunk_id: int) -> ChunkState:
        return self.ledger.states[chunk_id]

    def record_stream(self, tensor: torch.Tensor, stream) -> None:
        """`stream` uses this tensor: freeing or moving it waits for the work queued on `stream` by then."""
        users = self._users[self._tensors[tensor.data_ptr()][0]]
        if stream is not None and stream not in users:
            users.append(stream)

    def record_kv_stream(self, stream) -> None:
        """`stream` reads or writes the KV buffers (SGLang's forward stream under the overlap schedule):
        lending a chunk waits for the work queued on it by then."""
        if stream is not None and stream not in self._kv_streams:
            self._kv_streams.append(stream)

    def lend(self, chunk_id: int) -> None:
        """Unmap chunk_id from every K/V buffer; its blocks then back tensors. Its slots must be unused."""
        self.ledger.lend(chunk_id)
        _wait_for(self._kv_streams)
        self.backend.unmap_blocks(self._chunk_addrs(chunk_id))

    def reclaim(self, chunk_id: int) -> None:
        """Map an idle lent chunk back into every K/V buffer, zeroed: finetune bytes (weights, data) never
        become readable through the KV pool, and the chunk reads like never-used KV memory."""
        self.ledger.reclaim(chunk_id)
        addrs = self._chunk_addrs(chunk_id)
        self.backend.map_blocks_at(addrs, self.ledger.chunk_blocks(chunk_id))
        for addr in addrs:
            self.backend.zero(addr, self.block_bytes)

    def _chunk_addrs(self, chunk_id: int) -> list[int]:
        """Where chunk_id's block sits in each K/V buffer."""
        return [self._buffer_addr(b) + chunk_id * self.block_bytes for b in range(self.config.blocks_per_chunk)]

    def drain(self, chunk_id: int) -> bool:
        """Move every used block of lent chunk_id onto free blocks of other lent chunks (copy, then
        remap each tensor's address range: tensors keep their addresses), leaving it idle. False,
        with nothing moved, if the other lent chunks lack the free blocks. Waits for the streams that
        used the moved tensors (record_stream); no new work may use them until it returns."""
        used = self.ledger.used_blocks_of(chunk_id)
        if len(used) > self.ledger.num_free_blocks_outside(chunk_id):
            return False
        for owner in self.ledger.owners_of(used):
            _wait_for(self._users[owner])
        staging = self.backend.reserve(self.block_bytes)
        try:
            for src in used:
                dst, owners = self.ledger.move_block(src, chunk_id)
                slots = [(self._addr_of_owner[o], self.ledger.placement_of(o).block_ids.index(dst)) for o in owners]
                self.backend.map_blocks(staging, [dst])
                source_addr = slots[0][0] + slots[0][1] * self.block_bytes
                self.backend.byte_tensor(staging, self.block_bytes).copy_(
                    self.backend.byte_tensor(source_addr, self.block_bytes))
                self.backend.unmap(staging, self.block_bytes)
                for addr, index in slots:
                    self.backend.remap_block(addr + index * self.block_bytes, dst)
        finally:
            self.backend.release(staging, self.block_bytes)
        return True

    def alloc_tensor(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """A tensor over free bytes of lent blocks, mapped contiguously; free it with free_tensor.

        Its first block may be shared with an earlier tensor's tail, its last with a later one's head.
        """
        num_bytes = tensor_bytes(shape, dtype)
        self.check_fits(num_bytes)
        owner, self._next_owner = self._next_owner, self._next_owner + 1
        placement = self.ledger.place(owner, -(-num_bytes // ALIGN_BYTES) * ALIGN_BYTES)
        if placement is None:
            raise OutOfLentMemory(f"{num_bytes} bytes requested, {self.ledger.num_free_blocks} blocks free in lent chunks")
        mapped_bytes = len(placement.block_ids) * self.block_bytes
        try:
            addr = self.backend.reserve(mapped_bytes)
        except Exception:
            self.ledger.release(owner)
            raise
        try:
            self.backend.map_blocks(addr, placement.block_ids)
        except Exception:
            self.ledger.release(owner)
            self.backend.release(addr, mapped_bytes)
            raise
        raw = self.backend.byte_tensor(addr, mapped_bytes)[placement.offset_bytes: placement.offset_bytes + num_bytes]
        self._tensors[raw.data_ptr()] = (owner, addr, mapped_bytes, num_bytes)
        self._addr_of_owner[owner] = addr
        self._users[owner] = []
        return raw.view(dtype).view(tuple(shape))

    def check_fits(self, num_bytes: int) -> None:
        pool_bytes = self.config.num_chunks * self.config.blocks_per_chunk * self.block_bytes
        if num_bytes > pool_bytes:
            raise HarvestError(f"allocation of {num_bytes} bytes exceeds the whole pool ({pool_bytes} bytes)")

    def owns(self, tensor: torch.Tensor) -> bool:
        return tensor.data_ptr() in self._tensors

    def free_tensor(self, tensor: torch.Tensor) -> None:
        """Unmap the tensor's range and return its bytes, once the work queued so far on the streams that
        used it (record_stream, and the caller's stream) is done. No view of it may be used after."""
        data_ptr = tensor.data_ptr()
        if data_ptr not in self._tensors:
            raise HarvestError(f"free_tensor: {data_ptr:#x} is not a tensor allocated from lent chunks")
        owner, addr, mapped_bytes, _ = self._tensors.pop(data_ptr)
        del self._addr_of_owner[owner]
        _wait_for(self._users.pop(owner))
        self.backend.unmap(addr, mapped_bytes)
        self.backend.release(addr, mapped_bytes)
        self.ledger.release(owner)

    @property
    def requested_bytes(self) -> int:
        return sum(requested for _, _, _, requested in self._tensors.values())

    def close(self) -> None:
        for _, addr, mapped_bytes, _ in self._tensors.values():
            self.backend.unmap(addr, mapped_bytes)
            self.backend.release(addr, mapped_bytes)
        self._tensors.clear()
        # cuMemAddressFree needs the range unmapped; lent chunks already are.
        kv_chunk_ids = [c for c, state in enumerate(self.ledger.states) if state is ChunkState.KV]
        self.backend.unmap_blocks([addr for c in kv_chunk_ids for addr in self._chunk_addrs(c)])
        self.backend.release(self.kv_base, self.config.blocks_per_chunk * self.chunk_span_bytes)


def _wait_for(streams: Sequence) -> None:
    """Block until the work queued so far on each stream is done (an unmap is not stream-ordered)."""
    for stream in streams:
        stream.synchronize()


def tensor_bytes(shape: Sequence[int], dtype: torch.dtype) -> int:
    """Bytes of a tensor of this shape and dtype; a HarvestError for empty or negative shapes."""
    if any(not isinstance(size, int) or size <= 0 for size in shape):
        raise HarvestError(f"allocation shape {tuple(shape)} must have positive integer sizes")
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()
