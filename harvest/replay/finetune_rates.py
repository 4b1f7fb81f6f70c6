"""Finetune tokens/s at any SM share, from the few shares the profiler measured (predictor's
FinetuneThroughput): piecewise linear through (0, 0) and the measured points, flat past the largest one
(HARLI 5.2.3: once bandwidth binds, more SMs do not speed finetuning up)."""

from dataclasses import dataclass

import numpy as np

from base.errors import HarvestError
from predictor import Profile


@dataclass(frozen=True, slots=True)
class FinetuneRates:
    num_sms: int
    ft_sms: tuple[int, ...]
    solo_tokens_per_s: tuple[float, ...]
    colo_tokens_per_s: tuple[float, ...] | None
    """At colo_ft_sms; None when the profile measured no co-run (one partition: finetune only runs between
    decode steps)."""
    unit_ms: float
    """Mean finetune scheduling unit at the whole device: temporal sharing inserts whole units."""
    samples_per_token: float | None
    """Training samples per trained token, as the profiler measured them on the whole device (its samples/s
    over its tokens/s: optimizer steps x samples per step); None when the profile did not record samples."""
    colo_ft_sms: tuple[int, ...] = ()
    """The finetune partitions a co-run rate was measured on: a measured co-run profile has none for the
    whole device (nothing decodes beside it there), only the solo rate."""

    @classmethod
    def from_profile(cls, profile: Profile) -> "FinetuneRates":
        entries = sorted(profile.finetune_throughput, key=lambda t: t.ft_sms)
        if not entries:
            raise HarvestError(
                f"profile of {profile.device_name} has no finetune_throughput section: the simulator needs the "
                "finetune speed the profiler measured (re-run `harvest profile` with a finetune job)"
            )
        co_run = [t for t in entries if t.tokens_per_s_colo is not None]
        return cls(
            profile.num_sms,
            tuple(t.ft_sms for t in entries),
            tuple(t.tokens_per_s_solo for t in entries),
            tuple(t.tokens_per_s_colo for t in co_run) if co_run else None,
            entries[-1].unit_ms,
            None if entries[-1].samples_per_s_solo is None
            else entries[-1].samples_per_s_solo / entries[-1].tokens_per_s_solo,
            tuple(t.ft_sms for t in co_run),
        )

    def solo(self, ft_sms: int) -> float:
        """Tokens/s with the finetune job alone on `ft_sms` SMs."""
        return float(np.interp(ft_sms, (0, *self.ft_sms), (0.0, *self.solo_tokens_per_s)))

    def colo(self, ft_sms: int) -> float:
        """Tokens/s on `ft_sms` SMs beside decode."""
        if self.colo_tokens_per_s is None:
            raise HarvestError("this profile measured no co-run finetune throughput (a temporal-only device)")
        return float(np.interp(ft_sms, (0, *self.colo_ft_sms), (0.0, *self.colo_tokens_per_s)))

    @property
    def whole_device_tokens_per_s(self) -> float:
        return self.solo(self.num_sms)
