"""Which decoder layers' frozen weights to keep resident: the next W distinct layers the units will touch.

Torch-free. Units touch layers in the order F0..F(L-1), B(L-1)..B0 per row slice, so with the future known
exactly, keeping the W soonest-needed layers is Belady's optimal replacement for a window of W.
"""

import itertools
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WindowPolicy:
    num_layers: int
    """Decoder layers in the model."""

    def __post_init__(self) -> None:
        if self.num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {self.num_layers}")

    def pass_order(self) -> list[int]:
        """Layers one row slice touches: forward up, backward down."""
        return list(range(self.num_layers)) + list(reversed(range(self.num_layers)))

    def target_layers(self, upcoming_layer_ids: Iterable[int], num_window_layers: int) -> list[int]:
        """The first `num_window_layers` distinct layers of `upcoming_layer_ids`, soonest first.

        `upcoming_layer_ids` is the known future; it is extended by whole passes so the window is always full.
        """
        if not 1 <= num_window_layers <= self.num_layers:
            raise ValueError(f"num_window_layers must be in [1, {self.num_layers}], got {num_window_layers}")
        target: list[int] = []
        seen: set[int] = set()
        for layer_id in itertools.chain(upcoming_layer_ids, self.pass_order()):
            if layer_id not in seen:
                seen.add(layer_id)
                target.append(layer_id)
                if len(target) == num_window_layers:
                    break
        return target

