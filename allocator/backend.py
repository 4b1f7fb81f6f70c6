"""What ChunkPool needs from a memory backend: physical blocks that can be mapped at reserved addresses."""

from collections.abc import Sequence
from typing import Protocol

import torch


class Backend(Protocol):
    """A fixed set of physical blocks (ids 0..num_blocks-1) and address ranges to map them into.

    An unmapped address inside a reservation faults on access (host: PROT_NONE, CUDA: no mapping).
    """

    device: torch.device
    block_bytes: int
    num_blocks: int

    def reserve(self, num_bytes: int) -> int: ...

    def release(self, addr: int, num_bytes: int) -> None: ...

    def map_blocks(self, addr: int, block_ids: Sequence[int]) -> None:
        """Map block_ids[i] at addr + i * block_bytes, read/write; all-or-nothing."""

    def unmap(self, addr: int, num_bytes: int) -> None:
        """Unmap a range of whole blocks, after the caller's current stream (CUDA) has finished with it."""

    def map_blocks_at(self, addrs: Sequence[int], block_ids: Sequence[int]) -> None:
        """Map block_ids[i] at addrs[i] (one block each), in one native call; all-or-nothing."""

    def unmap_blocks(self, addrs: Sequence[int]) -> None:
        """Unmap the one block at each of addrs, in one native call, as `unmap` does."""

    def remap_block(self, addr: int, block_id: int) -> None:
        """Replace the block mapped at addr (one block long) by block_id."""

    def zero(self, addr: int, num_bytes: int) -> None:
        """Zero a mapped range (ordered before later work on the current stream, on CUDA)."""

    def byte_tensor(self, addr: int, num_bytes: int) -> torch.Tensor:
        """A uint8 tensor over [addr, addr + num_bytes) that does not own the memory."""

    def close(self) -> None: ...
