"""ServedLayers: the decoder layers' frozen weights are the served model's (shared mode), LayerSwapper's
interface with nothing to swap.

Every layer is resident and ready for good: its frozen weights are views of the worker's own tensors
(harvest.finetune.base_weights bound them), so there is no window to fill, shrink or lend KV memory to,
and the job holds no frozen-weight bytes of its own. Trainable (LoRA) parameters and buffers move to the
device as in copy mode.
"""

import contextlib

import torch
from torch import nn

from harvest.finetune.layer_swapper import move_buffers


class ServedLayers:
    def __init__(self, layers: nn.ModuleList, device: torch.device) -> None:
        self.device = device
        self.num_layers = len(layers)
        for layer in layers:
            for param in layer.parameters():
                if param.requires_grad:
                    param.data = param.data.to(device)
            move_buffers(layer, device)

    @property
    def num_resident_layers(self) -> int:
        return self.num_layers

    def window_bytes(self, num_layers: int) -> int:
        return 0

    def host_bytes(self) -> int:
        return 0

    def resident_bytes(self) -> int:
        return 0

    def is_resident(self, layer_id: int) -> bool:
        return True

    def residency(self, layer_id: int) -> int:
        return 0  # never moved

    def is_ready(self, layer_id: int) -> bool:
        return True

    def wait(self, layer_id: int) -> None:
        pass

    @contextlib.contextmanager
    def borrowed(self, layer_id: int):
        yield  # resident for good

    def apply(self, target_layer_ids: list[int]) -> None:
        pass  # the served weights stay where SGLang keeps them, whatever the window
