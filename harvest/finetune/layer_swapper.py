"""Frozen decoder-layer weights live in host memory; a window of layers is resident on the device (sec. 4.3).

Trainable (LoRA) parameters never move. A frozen parameter outside the window holds an empty placeholder,
so its device storage is really released; `fetch` restores it from the host copy. On CUDA the host copies
are pinned and fetches run on a second stream, overlapping compute; on CPU a fetch is a real copy into
fresh storage, so the mechanism (and its memory accounting) is the same, only synchronous.
"""

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(slots=True)
class _FrozenParam:
    param: nn.Parameter
    host: torch.Tensor


class LayerSwapper:
    def __init__(self, layers: nn.ModuleList, device: torch.device) -> None:
        self.device = device
        self._is_cuda = device.type == "cuda"
        self._copy_stream = torch.cuda.Stream(device) if self._is_cuda else None
        self._frozen: list[list[_FrozenParam]] = []
        self._ready_events: dict[int, torch.cuda.Event | None] = {}
        for layer in layers:
            frozen = []
            for param in layer.parameters():
                if param.requires_grad:
                    param.data = param.data.to(device)
                    continue
                host = param.data.detach().to("cpu")
                frozen.append(_FrozenParam(param, host.pin_memory() if self._is_cuda else host))
                param.data = self._placeholder(param.dtype)
            self._frozen.append(frozen)
            for buffer_name, buffer in layer.named_buffers():
                module_name, _, attr = buffer_name.rpartition(".")
                setattr(layer.get_submodule(module_name) if module_name else layer, attr, buffer.to(device))

    @property
    def num_layers(self) -> int:
        return len(self._frozen)

    @property
    def resident_layer_ids(self) -> frozenset[int]:
        return frozenset(self._ready_events)

    def layer_bytes(self, layer_id: int) -> int:
        return sum(f.host.numel() * f.host.element_size() for f in self._frozen[layer_id])

    def window_bytes(self, num_layers: int) -> int:
        """Device memory a window of `num_layers` resident layers needs (the largest layers, to be safe)."""
        sizes = sorted((self.layer_bytes(i) for i in range(self.num_layers)), reverse=True)
        return sum(sizes[:num_layers])

    def resident_bytes(self) -> int:
        return sum(self.layer_bytes(i) for i in self._ready_events)

    def fetch(self, layer_id: int) -> None:
        """Start bringing a layer's frozen weights onto the device (asynchronous on CUDA)."""
        if layer_id in self._ready_events:
            return
        if not self._is_cuda:
            for f in self._frozen[layer_id]:
                f.param.data = f.host.clone()
            self._ready_events[layer_id] = None
            return
        # Storage comes from the copy stream's pool and starts filling at once, overlapping the running unit;
        # `wait` records the compute stream on it, so after eviction the allocator reuses it only once the
        # compute kernels that read it have finished.
        with torch.cuda.stream(self._copy_stream):
            for f in self._frozen[layer_id]:
                f.param.data = f.host.to(self.device, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self._copy_stream)
        self._ready_events[layer_id] = event

    def is_ready(self, layer_id: int) -> bool:
        if layer_id not in self._ready_events:
            return False
        event = self._ready_events[layer_id]
        return event is None or event.query()

    def wait(self, layer_id: int) -> None:
        """Make the layer usable by the next kernels on the compute stream, fetching it if needed."""
        self.fetch(layer_id)
        event = self._ready_events[layer_id]
        if event is not None:
            compute_stream = torch.cuda.current_stream(self.device)
            compute_stream.wait_event(event)
            for f in self._frozen[layer_id]:
                f.param.data.record_stream(compute_stream)
            self._ready_events[layer_id] = None

    def evict(self, layer_id: int) -> None:
        if layer_id not in self._ready_events:
            return
        for f in self._frozen[layer_id]:
            f.param.data = self._placeholder(f.param.dtype)
        del self._ready_events[layer_id]

    def apply(self, target_layer_ids: list[int]) -> None:
        """Evict everything outside the target window, then fetch the target layers, soonest first."""
        for layer_id in sorted(self._ready_events.keys() - set(target_layer_ids)):
            self.evict(layer_id)
        for layer_id in target_layer_ids:
            self.fetch(layer_id)

    def _placeholder(self, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(0, dtype=dtype, device=self.device)
