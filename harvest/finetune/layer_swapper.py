"""Frozen decoder-layer weights live in host memory; a window of layers is resident on the device (sec. 4.3).

Trainable (LoRA) parameters never move. A resident layer's frozen weights sit in one flat device tensor per
dtype, taken from a `WeightMemory` (torch's allocator, or KV-cache chunks lent by the unified allocator);
each frozen parameter is a view of it. Outside the window a parameter holds an empty placeholder and the
flat tensor goes back to the memory, so eviction really returns the bytes. On CUDA the host copies are
pinned and fetches run on a second stream, overlapping compute; on CPU a fetch is a synchronous copy.
"""

import contextlib
from dataclasses import dataclass

import torch
from torch import nn

from harvest.finetune.weight_memory import TorchWeightMemory, WeightMemory


@dataclass(slots=True)
class _FrozenGroup:
    """One layer's frozen parameters of one dtype, packed in `host` (flat) in `params` order."""

    params: list[nn.Parameter]
    shapes: list[torch.Size]
    host: torch.Tensor
    resident: torch.Tensor | None = None


class LayerSwapper:
    def __init__(self, layers: nn.ModuleList, device: torch.device, memory: WeightMemory | None = None) -> None:
        self.device = device
        self.memory = memory or TorchWeightMemory(device)
        self._is_cuda = device.type == "cuda"
        self._copy_stream = torch.cuda.Stream(device) if self._is_cuda else None
        self._groups: list[list[_FrozenGroup]] = []
        self._ready_events: dict[int, torch.cuda.Event | None] = {}
        self._residencies: dict[int, int] = {}
        self._num_fetches = 0
        for layer in layers:
            by_dtype: dict[torch.dtype, list[nn.Parameter]] = {}
            for param in layer.parameters():
                if param.requires_grad:
                    param.data = param.data.to(device)
                else:
                    by_dtype.setdefault(param.dtype, []).append(param)
            groups = []
            for dtype, params in by_dtype.items():
                host = torch.cat([p.data.detach().to("cpu").reshape(-1) for p in params])
                host = host.pin_memory() if self._is_cuda else host
                groups.append(_FrozenGroup(params, [p.shape for p in params], host))
                for param in params:
                    param.data = self._placeholder(dtype)
            self._groups.append(groups)
            move_buffers(layer, device)

    @property
    def num_layers(self) -> int:
        return len(self._groups)

    @property
    def num_resident_layers(self) -> int:
        return len(self._ready_events)

    def layer_bytes(self, layer_id: int) -> int:
        return sum(g.host.numel() * g.host.element_size() for g in self._groups[layer_id])

    def window_bytes(self, num_layers: int) -> int:
        """Device memory a window of `num_layers` resident layers needs (the largest layers, to be safe)."""
        sizes = sorted((self.layer_bytes(i) for i in range(self.num_layers)), reverse=True)
        return sum(sizes[:num_layers])

    def host_bytes(self) -> int:
        """The host copies of every layer's frozen weights (the job's own copy of the base model's layers)."""
        return sum(self.layer_bytes(i) for i in range(self.num_layers))

    def resident_bytes(self) -> int:
        return sum(self.layer_bytes(i) for i in self._ready_events)

    def fetch(self, layer_id: int) -> bool:
        """Start bringing a layer's frozen weights onto the device (asynchronous on CUDA); False, with
        nothing changed, when the memory has no room for it now."""
        if layer_id in self._ready_events:
            return True
        groups = self._groups[layer_id]
        # On CUDA the storage starts filling at once on the copy stream, overlapping the running unit. The
        # memory records the copy stream now and the compute stream in `wait`, so eviction (even right
        # after this prefetch, as shrink_window does) frees the storage only once both are done with it.
        with torch.cuda.stream(self._copy_stream) if self._is_cuda else contextlib.nullcontext():
            if not self._alloc_resident(groups):
                return False
            for group in groups:
                group.resident.copy_(group.host, non_blocking=self._is_cuda)
                if self._is_cuda:
                    self.memory.record_stream(group.resident, self._copy_stream)
                _bind(group, group.resident)
            event = None
            if self._is_cuda:
                event = torch.cuda.Event()
                event.record(self._copy_stream)
        self._ready_events[layer_id] = event
        self._num_fetches += 1
        self._residencies[layer_id] = self._num_fetches
        return True

    def is_resident(self, layer_id: int) -> bool:
        """Fetched (or being fetched) and not evicted since."""
        return layer_id in self._ready_events

    def residency(self, layer_id: int) -> int | None:
        """Which fetch of the layer is resident (None: not resident): the same number means its weights have
        not moved since."""
        return self._residencies.get(layer_id)

    def is_ready(self, layer_id: int) -> bool:
        if layer_id not in self._ready_events:
            return False
        event = self._ready_events[layer_id]
        return event is None or event.query()

    def wait(self, layer_id: int) -> None:
        """Make the layer usable by the next kernels on the compute stream, fetching it if needed."""
        if not self.fetch(layer_id):
            raise MemoryError(f"no device memory for decoder layer {layer_id}'s frozen weights")
        event = self._ready_events[layer_id]
        if event is not None:
            compute_stream = torch.cuda.current_stream(self.device)
            compute_stream.wait_event(event)
            for group in self._groups[layer_id]:
                self.memory.record_stream(group.resident, compute_stream)
            self._ready_events[layer_id] = None

    @contextlib.contextmanager
    def borrowed(self, layer_id: int):
        """The layer's frozen weights on the device for the block, in torch's memory, never `memory` (the unit
        thread's: this runs while the engine is built); placeholders again after it. The window (what is
        resident, fetch counts) does not change. On a CPU the weights are the host copies themselves."""
        if layer_id in self._ready_events:
            yield
            return
        groups = self._groups[layer_id]
        for group in groups:
            _bind(group, group.host.to(self.device))
        try:
            yield
        finally:
            for group in groups:
                for param in group.params:
                    param.data = self._placeholder(param.dtype)

    def evict(self, layer_id: int) -> None:
        if layer_id not in self._ready_events:
            return
        for group in self._groups[layer_id]:
            for param in group.params:
                param.data = self._placeholder(param.dtype)
            self.memory.free_tensor(group.resident)
            group.resident = None
        del self._ready_events[layer_id]
        del self._residencies[layer_id]

    def apply(self, target_layer_ids: list[int]) -> None:
        """Evict everything outside the target window, then fetch the target layers, soonest first. When the
        memory holds fewer layers than the window, a target needed sooner takes the place of the resident
        target needed last (Belady's choice for the window the memory can hold), so units never wait on
        a layer while later ones sit resident."""
        for layer_id in sorted(self._ready_events.keys() - set(target_layer_ids)):
            self.evict(layer_id)
        for index, layer_id in enumerate(target_layer_ids):
            needed_later = None  # listed only when the memory is full: most units fetch nothing
            while not self.fetch(layer_id):
                if needed_later is None:
                    needed_later = [i for i in target_layer_ids[index + 1:] if i in self._ready_events]
                if not needed_later:
                    return
                self.evict(needed_later.pop())

    def _alloc_resident(self, groups: list[_FrozenGroup]) -> bool:
        for index, group in enumerate(groups):
            try:
                group.resident = self.memory.alloc_tensor(group.host.shape, group.host.dtype)
            except MemoryError:
                for taken in groups[:index]:
                    self.memory.free_tensor(taken.resident)
                    taken.resident = None
                return False
        return True

    def _placeholder(self, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(0, dtype=dtype, device=self.device)


def _bind(group: _FrozenGroup, flat: torch.Tensor) -> None:
    """Make each of the group's parameters a view of its place in `flat`."""
    offset = 0
    for param, shape in zip(group.params, group.shapes):
        param.data = flat[offset: offset + shape.numel()].view(shape)
        offset += shape.numel()


def move_buffers(layer: nn.Module, device: torch.device) -> None:
    """A layer's buffers (rotary tables and the like) to the device its units run on."""
    for buffer_name, buffer in layer.named_buffers():
        module_name, _, attr = buffer_name.rpartition(".")
        setattr(layer.get_submodule(module_name) if module_name else layer, attr, buffer.to(device))
