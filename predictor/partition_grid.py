"""Which SM partitions exist on a device: (infer_sms, ft_sms) pairs on the green-context granularity."""

from dataclasses import dataclass

from base.errors import HarvestError

# H100 SXM: 132 SMs, green-context groups of 8 (STACK.md). A CPU has one partition: all of it decodes,
# and finetune units run between decode steps (temporal sharing), so there are no co-run pairs.
# Far above any GPU (H100 132, B200 148 per die); bounds the partition grid a corrupt profile can ask for.
MAX_NUM_SMS = 1024

PRESETS = {
    "h100": (132, 8),
    "cpu": (1, 1),
}


@dataclass(frozen=True, slots=True)
class PartitionGrid:
    num_sms: int
    """SMs on the device (1 on a CPU)."""

    sm_granularity: int
    """Partitions are multiples of this many SMs, except the whole device."""

    def __post_init__(self) -> None:
        if not 1 <= self.num_sms <= MAX_NUM_SMS:
            raise HarvestError(f"num_sms must be in [1, {MAX_NUM_SMS}], got {self.num_sms}")
        if not 1 <= self.sm_granularity <= self.num_sms:
            raise HarvestError(f"sm_granularity must be in [1, num_sms={self.num_sms}], got {self.sm_granularity}")

    def __str__(self) -> str:
        return f"{self.num_sms} SMs in groups of {self.sm_granularity}"

    @classmethod
    def from_name(cls, name: str) -> "PartitionGrid":
        if name not in PRESETS:
            raise HarvestError(f"unknown device preset {name!r}; known: {', '.join(sorted(PRESETS))}")
        return cls(*PRESETS[name])

    def infer_options(self) -> tuple[int, ...]:
        """SM counts decode can run on: the multiples of the granularity, and the whole device."""
        g = self.sm_granularity
        return tuple(sorted(set(range(g, self.num_sms + 1, g)) | {self.num_sms}))

    def ft_options(self, infer_sms: int) -> tuple[int, ...]:
        """SM counts the finetune job can co-run on beside `infer_sms` (not all SMs need be used)."""
        g = self.sm_granularity
        return tuple(range(g, self.num_sms - infer_sms + 1, g)) if infer_sms % g == 0 else ()

    def pairs(self) -> tuple[tuple[int, int], ...]:
        """Every co-run partition (infer_sms, ft_sms) with ft_sms > 0."""
        return tuple((i, f) for i in self.infer_options() for f in self.ft_options(i))

    def is_partition(self, infer_sms: int, ft_sms: int) -> bool:
        if infer_sms not in self.infer_options():
            return False
        return ft_sms == 0 or ft_sms in self.ft_options(infer_sms)

    def ratio(self, num_sms: int) -> float:
        return num_sms / self.num_sms

    def to_sms(self, ratio: float, what: str) -> int:
        """The SM count a measured ratio stands for; HarvestError if it is no whole number of SMs."""
        sms = round(ratio * self.num_sms)
        if abs(ratio * self.num_sms - sms) > 0.05:
            raise HarvestError(f"{what} {ratio} is not a whole number of the device's {self.num_sms} SMs")
        return sms
