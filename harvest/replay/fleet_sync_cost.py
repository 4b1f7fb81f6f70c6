"""What one fleet round costs a worker in the simulated replay: the adapter delta's all-reduce, as a
bandwidth term and a per-round latency, charged to every member's finetune time (fleet_replay.py)."""

import math
from dataclasses import dataclass

from base.errors import HarvestError
from harvest.models.model_shape import ModelShape

LORA_RANK = 8
"""The demo job's lora_rank (harvest/finetune/demo/demo.yaml), on all seven projections (lora_target: all)."""
MODEL_OF_MEMORY_PRESET = {
    "h100-llama3-8b": ModelShape.from_name("llama3-8b"),
    # HuggingFaceTB/SmolLM2-135M's config.json.
    "cpu-smollm2-135m": ModelShape(vocab_size=49152, hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                                   num_key_value_heads=3, intermediate_size=1536),
}
# fleet_sync.py all-reduces the delta as host fp32 tensors over torchft's gloo group on every device kind
# (no NCCL), between hosts: 10 Gbit/s is what a gloo TCP ring keeps of a 25 GbE datacenter NIC, and 50 ms
# covers a round's three control trips (lighthouse quorum, fingerprint all-reduce, commit vote). Both
# guessed, not measured; an NCCL fleet is --fleet-link-gbps 400 --fleet-round-latency-ms 5.
DEFAULT_LINK_GBPS = 10.0
DEFAULT_ROUND_LATENCY_MS = 50.0


def lora_adapter_bytes(shape: ModelShape, rank: int = LORA_RANK) -> int:
    """The buffer a round sends (adapter_delta.weighted_buffer): r x (in + out) fp32 per projection of every
    layer, plus the token count."""
    h, kv, i = shape.hidden_size, shape.num_key_value_heads * shape.head_dim, shape.intermediate_size
    per_layer = rank * ((h + h) * 2 + (h + kv) * 2 + (h + i) * 3)  # q, o; k, v; gate, up, down
    return 4 * (per_layer * shape.num_hidden_layers + 1)


@dataclass(frozen=True, slots=True)
class SyncCost:
    adapter_bytes: int
    """Bytes of the buffer each member all-reduces in a round."""
    link_gbps: float = DEFAULT_LINK_GBPS
    """Bandwidth each member's all-reduce gets, in Gbit/s."""
    round_latency_ms: float = DEFAULT_ROUND_LATENCY_MS
    """A round's fixed time: quorum, the fingerprints' all-reduce, the commit vote."""

    def __post_init__(self) -> None:
        if self.adapter_bytes < 1:
            raise HarvestError(f"--fleet-adapter-bytes must be >= 1, got {self.adapter_bytes}")
        if not (math.isfinite(self.link_gbps) and self.link_gbps > 0):
            raise HarvestError(f"--fleet-link-gbps must be a positive number, got {self.link_gbps}")
        if not (math.isfinite(self.round_latency_ms) and self.round_latency_ms >= 0):
            raise HarvestError(f"--fleet-round-latency-ms must be >= 0, got {self.round_latency_ms}")

    @classmethod
    def for_memory(cls, memory_preset: str, adapter_bytes: int | None = None, link_gbps: float | None = None,
                   round_latency_ms: float | None = None) -> "SyncCost":
        """The adapter of the preset's model and the default link unless given."""
        if adapter_bytes is None:
            if memory_preset not in MODEL_OF_MEMORY_PRESET:
                raise HarvestError(f"no model known for memory preset {memory_preset!r}: give --fleet-adapter-bytes")
            adapter_bytes = lora_adapter_bytes(MODEL_OF_MEMORY_PRESET[memory_preset])
        return cls(adapter_bytes, DEFAULT_LINK_GBPS if link_gbps is None else link_gbps,
                   DEFAULT_ROUND_LATENCY_MS if round_latency_ms is None else round_latency_ms)

    def round_ms(self, num_members: int) -> float:
        """One member's time in a round of `num_members`: a ring all-reduce sends and receives 2 (n - 1) / n of
        the buffer (gloo's and NCCL's ring); a fleet of one has no round (a worker without --fleet)."""
        if num_members < 2:
            return 0.0
        moved_bytes = 2 * (num_members - 1) / num_members * self.adapter_bytes
        return self.round_latency_ms + moved_bytes * 8 / (self.link_gbps * 1e9) * 1e3
