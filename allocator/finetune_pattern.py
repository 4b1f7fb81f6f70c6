"""FinetunePattern: the tensors a layer-wise LoRA finetune of a model keeps live, for sizing and benches.

Synthesised from the model's shape (no weights needed): a window of frozen per-layer weights, LoRA
adapters with Adam states, one checkpointed hidden state per layer, and the working activations of
the layer being trained.
"""

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ModelShape:
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int


SMOLLM2_135M = ModelShape(num_layers=30, hidden=576, num_heads=9, num_kv_heads=3, head_dim=64,
                          intermediate=1536, vocab=49152)


@dataclass(frozen=True, slots=True)
class FinetunePattern:
    shape: ModelShape = SMOLLM2_135M
    dtype_bytes: int = 2
    """Frozen weights and activations (bf16)."""
    num_tokens: int = 2048
    """Tokens in one micro-batch."""
    window_layers: int = 8
    """Layers of frozen weights resident at once (the weight window)."""
    lora_rank: int = 8
    flat_layer_buffers: bool = True
    """Window layers as one buffer each (one copy per layer swap) rather than one tensor per weight."""

    def __post_init__(self):
        if not (0 < self.window_layers <= self.shape.num_layers and self.num_tokens > 0 and self.lora_rank > 0):
            raise ValueError(f"bad finetune pattern {self}")

    def linear_shapes(self) -> list[tuple[int, int]]:
        """(in, out) of the seven LoRA-targeted projections of one layer."""
        s = self.shape
        q, kv = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
        return [(s.hidden, q), (s.hidden, kv), (s.hidden, kv), (q, s.hidden),
                (s.hidden, s.intermediate), (s.hidden, s.intermediate), (s.intermediate, s.hidden)]

    def layer_weight_sizes(self) -> list[int]:
        norms = [self.shape.hidden * self.dtype_bytes] * 2
        return [i * o * self.dtype_bytes for i, o in self.linear_shapes()] + norms

    def lora_sizes(self) -> list[int]:
        """Per layer: A and B of each projection in fp32, plus Adam's two fp32 states and the grads."""
        sizes = []
        for i, o in self.linear_shapes():
            for elements in (i * self.lora_rank, self.lora_rank * o):
                sizes += [elements * 4] * 4
        return sizes

    def working_activation_sizes(self) -> list[int]:
        s, t, b = self.shape, self.num_tokens, self.dtype_bytes
        widths = [s.hidden, s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim, s.num_kv_heads * s.head_dim,
                  s.num_heads * s.head_dim, s.hidden, s.hidden, s.intermediate, s.intermediate, s.intermediate]
        return [t * w * b for w in widths]

    def allocations(self) -> list[tuple[str, int]]:
        """(kind, bytes) in the order a finetune step would allocate them."""
        layer = [sum(self.layer_weight_sizes())] if self.flat_layer_buffers else self.layer_weight_sizes()
        allocs = [("window", n) for _ in range(self.window_layers) for n in layer]
        allocs += [("lora", n) for _ in range(self.shape.num_layers) for n in self.lora_sizes()]
        allocs += [("checkpoint", self.num_tokens * self.shape.hidden * self.dtype_bytes)] * self.shape.num_layers
        allocs += [("activation", n) for n in self.working_activation_sizes()]
        return allocs
