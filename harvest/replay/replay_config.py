"""Settings of a simulated replay: the SLO, the baselines' fixed split, and the device's memory."""

import math
from dataclasses import dataclass

from base.errors import HarvestError

POLICIES = ("separate", "static", "harvest", "temporal")
"""What `--policy all` runs; `--with-oracle` adds the oracle yardstick."""
KNOWN_POLICIES = (*POLICIES, "oracle")


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    """What the memory side of HARLI (sec. 4) needs to know: KV pool size and the finetune footprint."""

    name: str
    kv_capacity_tokens: int
    """Tokens the decode worker's KV pool holds when it has the whole device's memory."""
    kv_bytes_per_token: int
    """KV bytes of one token over all layers (k and v)."""
    ft_num_layers: int
    ft_layer_bytes: int
    """Frozen weights of one finetune layer: the unit the weight window swaps."""
    ft_resident_bytes: int
    """Always on the device while finetuning: LoRA weights, optimizer state, activations of a micro-batch."""
    host_link_bytes_per_s: float
    """Host-device copy bandwidth; sets how long giving one layer back takes (the HARLI reserve)."""
    basis: str = "guessed"
    """Which of the numbers above were measured and which are guessed (printed with every simulated replay)."""

    def __post_init__(self) -> None:
        for name in ("kv_capacity_tokens", "kv_bytes_per_token", "ft_num_layers", "ft_layer_bytes"):
            if getattr(self, name) < 1:
                raise HarvestError(f"memory {self.name}: {name} must be >= 1, got {getattr(self, name)}")
        if self.ft_resident_bytes < 0 or not (
            math.isfinite(self.host_link_bytes_per_s) and self.host_link_bytes_per_s > 0
        ):
            raise HarvestError(f"memory {self.name}: ft_resident_bytes must be >= 0 and host_link_bytes_per_s > 0")

    @property
    def pool_bytes(self) -> int:
        return self.kv_capacity_tokens * self.kv_bytes_per_token

    def with_kv_capacity(self, kv_capacity_tokens: int | None) -> "DeviceMemory":
        if kv_capacity_tokens is None:
            return self
        return DeviceMemory(
            self.name,
            kv_capacity_tokens,
            self.kv_bytes_per_token,
            self.ft_num_layers,
            self.ft_layer_bytes,
            self.ft_resident_bytes,
            self.host_link_bytes_per_s,
            f"{self.basis}; kv_capacity_tokens set by --kv-capacity-tokens",
        )

    @classmethod
    def for_profile(cls, profile, name: str | None = None) -> "DeviceMemory":
        """The preset `name`, or by default the one of the profile's device kind: the CPU demo's for a profile
        measured on a CPU host, else the H100's."""
        return cls.from_name(name or ("cpu-smollm2-135m" if profile.is_cpu else "h100-llama3-8b"))

    @classmethod
    def from_name(cls, name: str) -> "DeviceMemory":
        if name not in MEMORY_PRESETS:
            raise HarvestError(f"unknown memory preset {name!r}; known: {', '.join(sorted(MEMORY_PRESETS))}")
        return MEMORY_PRESETS[name]


GIB = 1 << 30
MEMORY_PRESETS = {
    # H100 80 GB serving Llama3-8B in bf16: ~16 GB weights and ~8 GB activations/graphs leave ~52 GB of KV
    # at 128 KiB per token (32 layers x 8 KV heads x 128 x 2 x 2 B); the finetune job's frozen layer is
    # 218 M params x 2 B, and a micro-batch of 2 x 1024 tokens with LoRA state keeps ~4 GB resident.
    "h100-llama3-8b": DeviceMemory(
        "h100-llama3-8b", 52 * GIB // (128 << 10), 128 << 10, 32, 436_000_000, 4 * GIB, 25e9,
        "all guessed: arithmetic from Llama3-8B's shapes and H100 datasheet figures, no H100 measured",
    ),
    # The CPU demo: SmolLM2-135M served with an fp16 KV cache (30 layers x 3 KV heads x 64 x 2 x 2 B = 22.5 KiB
    # per token), the KV pool `harvest demo` starts with (16384 tokens), a 3.54 M-param fp32 frozen layer
    # (14.16 MB, measured as the engine's resident bytes / 30).
    "cpu-smollm2-135m": DeviceMemory(
        "cpu-smollm2-135m", 16384, 23040, 30, 14_160_384, 200_000_000, 10e9,
        "measured: ft_layer_bytes; from the worker's config: kv_capacity_tokens, kv_bytes_per_token; "
        "guessed: ft_resident_bytes, host_link_bytes_per_s",
    ),
}


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    tpot_slo_ms: float = 40.0
    """Decode-step latency target (HARLI evaluates at 40 ms)."""
    policies: tuple[str, ...] = POLICIES
    static_infer_share: float = 0.6
    """StaticMode's fixed share of SMs and of memory for decode (HARLI: 60 %)."""
    max_running_requests: int = 256
    """Largest decode batch the worker admits."""
    min_window_layers: int = 1
    """Fewest frozen layers the lent memory must hold for the finetune job to have ready work."""
    latency_noise: float = 0.0
    """Sigma of log-normal noise between the profile and the simulated device (0: the profile is exact)."""
    plan_margin: float = 0.0
    """> 0: harvest and temporal plan for tpot_slo_ms * (1 - plan_margin), an explicit override; 0: temporal
    plans for the target and harvest learns its margin online (predictor.plan_margin)."""
    seed: int = 0
    num_series_points: int = 600
    """Points per time series kept in results.json and plotted."""

    @property
    def plan_target_ms(self) -> float:
        return self.tpot_slo_ms * (1.0 - self.plan_margin)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.tpot_slo_ms) and self.tpot_slo_ms > 0):
            raise HarvestError(f"TPOT target must be a positive number of ms, got {self.tpot_slo_ms}")
        unknown = [p for p in self.policies if p not in KNOWN_POLICIES]
        if unknown or not self.policies:
            raise HarvestError(
                f"policies must be among {', '.join(KNOWN_POLICIES)} (or all), got {', '.join(self.policies)}"
            )
        if not 0.0 < self.static_infer_share < 1.0:
            raise HarvestError(f"static decode share must be in (0, 1), got {self.static_infer_share}")
        if self.max_running_requests < 1 or self.min_window_layers < 1:
            raise HarvestError("max running requests and min window layers must be >= 1")
        if not (math.isfinite(self.latency_noise) and self.latency_noise >= 0):
            raise HarvestError(f"latency noise must be >= 0, got {self.latency_noise}")
        if not 0.0 <= self.plan_margin < 1.0:
            raise HarvestError(f"plan margin must be in [0, 1), got {self.plan_margin}")
        if self.num_series_points < 2:
            raise HarvestError(f"num_series_points must be >= 2, got {self.num_series_points}")
