"""Where the resident window's frozen weights live on the device.

`TorchWeightMemory` is torch's own allocator (the engine alone). Inside a decode worker the unified allocator
(`allocator.UnifiedAllocator`, memory lent from free KV-cache chunks) takes its place: same two calls.
"""

from collections.abc import Sequence
from typing import Protocol

import torch


class WeightMemory(Protocol):
    def alloc_tensor(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """A tensor for one layer's frozen weights; MemoryError when none can be had right now."""

    def record_stream(self, tensor: torch.Tensor, stream: torch.cuda.Stream) -> None:
        """`stream` uses the tensor: free_tensor must not let its memory go before that work is done."""

    def free_tensor(self, tensor: torch.Tensor) -> None:
        """Give back a tensor from alloc_tensor; no view of it is used afterwards."""


class TorchWeightMemory:
    def __init__(self, device: torch.device):
        self.device = device

    def alloc_tensor(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(tuple(shape), dtype=dtype, device=self.device)

    def record_stream(self, tensor: torch.Tensor, stream: torch.cuda.Stream) -> None:
        tensor.record_stream(stream)

    def free_tensor(self, tensor: torch.Tensor) -> None:
        pass  # torch frees the storage with its last reference
