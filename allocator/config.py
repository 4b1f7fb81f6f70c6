"""AllocatorConfig: the shape of the unified pool (HARLI sec. 4) and the inputs of its reserve."""

import math
from dataclasses import dataclass

from base.errors import HarvestError

MIB = 1 << 20
BACKENDS = ("host", "cuda")


def kv_reserve_slots(release_ms: float, tpot_ms: float, max_batch: int) -> int:
    """Token slots kept free for KV growth while lent memory comes back: HARLI 4.4, (T_release / TPOT) *
    max_batch. The worker's allocator and the simulated replay both reserve by this."""
    return math.ceil(release_ms / tpot_ms * max_batch)


@dataclass(frozen=True, slots=True)
class AllocatorConfig:
    num_layers: int
    """Attention layers in the decode model; a chunk is 2 x num_layers blocks (K and V of each)."""
    kv_row_bytes: int
    """Bytes of one token's K (equally V) in one layer: num_kv_heads * head_dim * dtype bytes."""
    num_chunks: int
    """Chunks in the pool; chunk i backs token slots [i*T, (i+1)*T) of every layer."""
    block_bytes: int = 2 * MIB
    """Mapping granularity. 2 MiB on CUDA; the host backend accepts any page multiple (tests use less)."""
    backend: str = "host"
    """'host' (memfd/mmap) or 'cuda' (cuMem*)."""
    device_index: int = 0
    """CUDA device ordinal for the cuda backend."""
    release_ms: float = 0.0
    """T_release: time to swap out one layer of finetune frozen weights."""
    tpot_target_ms: float = 50.0
    """The decode TPOT SLO."""
    max_batch: int = 1
    """Largest decode batch the worker admits."""

    def __post_init__(self):
        for name in ("num_layers", "kv_row_bytes", "num_chunks", "block_bytes", "max_batch"):
            if getattr(self, name) <= 0:
                raise HarvestError(f"{name} must be positive, got {getattr(self, name)}")
        if self.block_bytes % self.kv_row_bytes:
            raise HarvestError(f"block_bytes {self.block_bytes} is not a multiple of kv_row_bytes {self.kv_row_bytes}")
        if self.release_ms < 0 or self.tpot_target_ms <= 0:
            raise HarvestError("release_ms must be >= 0 and tpot_target_ms > 0")
        if self.backend not in BACKENDS:
            raise HarvestError(f"backend must be one of {BACKENDS}, got {self.backend!r}")

    @property
    def slots_per_chunk(self) -> int:
        return self.block_bytes // self.kv_row_bytes

    @property
    def blocks_per_chunk(self) -> int:
        return 2 * self.num_layers

    @property
    def num_slots(self) -> int:
        return self.num_chunks * self.slots_per_chunk

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.kv_row_bytes

    @property
    def reserve_slots(self) -> int:
        return kv_reserve_slots(self.release_ms, self.tpot_target_ms, self.max_batch)

    @property
    def reserve_bytes(self) -> int:
        return self.reserve_slots * self.kv_bytes_per_token

    @staticmethod
    def for_kv_pool(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int, num_tokens: int,
                    granularity_bytes: int = 2 * MIB, **fields) -> "AllocatorConfig":
        """The smallest pool whose slots cover SGLang's num_tokens plus its padded slot 0.

        A block must hold whole token rows and be a multiple of the mapping granularity, so
        block_bytes = lcm(granularity, row bytes): 6 MiB for SmolLM2's 384-byte bf16 rows.
        """
        kv_row_bytes = num_kv_heads * head_dim * dtype_bytes
        block_bytes = math.lcm(granularity_bytes, kv_row_bytes)
        num_chunks = math.ceil((num_tokens + 1) / (block_bytes // kv_row_bytes))
        return AllocatorConfig(num_layers=num_layers, kv_row_bytes=kv_row_bytes, num_chunks=num_chunks,
                               block_bytes=block_bytes, **fields)
