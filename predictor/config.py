"""Settings of the latency predictor: how it fits and how fast the online correction follows."""

from dataclasses import dataclass

from base.errors import HarvestError


@dataclass(frozen=True, slots=True)
class PredictorConfig:
    ewma_alpha: float = 0.2
    """Weight of the newest measured/predicted ratio in the online correction (0 < alpha <= 1)."""

    plateau_candidates: tuple[int, ...] = (1, 2, 4, 8, 16)
    """Batch sizes tried as the end of the small-batch plateau (padding quanta); 1 means no plateau."""

    num_cv_folds: int = 5
    """Folds of the cross-validation that picks the co-run form."""

    min_colo_samples: int = 4
    """Fewest co-run samples stage 2 is fitted from; with none, the profile has no co-run model."""

    def __post_init__(self) -> None:
        if not 0.0 < self.ewma_alpha <= 1.0:
            raise HarvestError(f"ewma_alpha must be in (0, 1], got {self.ewma_alpha}")
        if not self.plateau_candidates or any(p < 1 for p in self.plateau_candidates):
            raise HarvestError(f"plateau_candidates must be batch sizes >= 1, got {self.plateau_candidates}")
        if list(self.plateau_candidates) != sorted(set(self.plateau_candidates)):
            raise HarvestError(f"plateau_candidates must be strictly increasing, got {self.plateau_candidates}")
        if self.num_cv_folds < 2:
            raise HarvestError(f"num_cv_folds must be >= 2, got {self.num_cv_folds}")
        if self.min_colo_samples < 3:
            raise HarvestError(f"min_colo_samples must be >= 3, got {self.min_colo_samples}")


DEFAULT_CONFIG = PredictorConfig()
