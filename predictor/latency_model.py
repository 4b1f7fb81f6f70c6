"""The two-stage decode-latency model: stage 1 solo per inference partition, stage 2 co-run slowdown."""

from dataclasses import dataclass

import numpy as np

from base.errors import HarvestError
from predictor.colo_model import ColoModel
from predictor.config import DEFAULT_CONFIG, PredictorConfig
from predictor.fit_metrics import FitMetrics
from predictor.json_reader import JsonReader
from predictor.partition_grid import PartitionGrid
from predictor.samples import Sample
from predictor.solo_model import SoloModel


@dataclass(frozen=True, slots=True)
class LatencyModel:
    grid: PartitionGrid
    solo: SoloModel
    colo: ColoModel | None
    """None when the profile has no co-run samples (a CPU: finetune runs between decode steps)."""

    def __post_init__(self) -> None:
        for sms in self.solo.infer_options:
            if sms not in self.grid.infer_options():
                raise HarvestError(f"solo model at {sms} SMs is not a partition of {self.grid}")
        if self.colo is not None:
            for infer_sms, ft_sms in self.partitions():
                if ft_sms and self.slowdown(infer_sms, ft_sms) <= 0:
                    raise HarvestError(f"co-run model predicts a slowdown <= 0 at ({infer_sms}, {ft_sms}) SMs")

    @property
    def has_colo(self) -> bool:
        return self.colo is not None

    def partitions(self) -> list[tuple[int, int]]:
        """Every partition the model can predict: solo ones, then co-run ones if there is a co-run model."""
        solo = [(i, 0) for i in self.solo.infer_options]
        if self.colo is None:
            return solo
        return solo + [(i, f) for i in self.solo.infer_options for f in self.grid.ft_options(i)]

    def slowdown(self, infer_sms: int, ft_sms: int) -> float:
        if ft_sms == 0:
            return 1.0
        if self.colo is None:
            raise HarvestError("this profile has no co-run model (no co-run samples were profiled)")
        return self.colo.slowdown(self.grid.ratio(infer_sms), self.grid.ratio(ft_sms))

    def predict_solo_ms(self, infer_sms: int, batch_size: int, seq_len: float) -> float:
        return self.solo.predict_ms(infer_sms, batch_size, seq_len)

    def predict_colo_ms(self, infer_sms: int, ft_sms: int, batch_size: int, seq_len: float) -> float:
        return self.slowdown(infer_sms, ft_sms) * self.solo.predict_ms(infer_sms, batch_size, seq_len)

    def predict_sample_ms(self, s: Sample) -> float:
        infer_sms = self.grid.to_sms(s.infer_sm_ratio, "infer_sm_ratio")
        ft_sms = self.grid.to_sms(s.ft_sm_ratio, "ft_sm_ratio")
        return self.predict_colo_ms(infer_sms, ft_sms, s.batch_size, s.seq_len)

    @classmethod
    def fit(
        cls, samples: list[Sample], grid: PartitionGrid, config: PredictorConfig = DEFAULT_CONFIG
    ) -> "LatencyModel":
        solo_samples = [s for s in samples if s.is_solo]
        colo_samples = [s for s in samples if not s.is_solo]
        solo = SoloModel.fit(solo_samples, grid, config)
        if not colo_samples:
            return cls(grid, solo, None)
        infer_sms = [grid.to_sms(s.infer_sm_ratio, "infer_sm_ratio") for s in colo_samples]
        for s, sms in zip(colo_samples, infer_sms, strict=True):
            ft_sms = grid.to_sms(s.ft_sm_ratio, "ft_sm_ratio")
            if not grid.is_partition(sms, ft_sms):
                raise HarvestError(f"co-run sample at ({sms}, {ft_sms}) SMs is not a partition of {grid}")
            if sms not in solo.infer_options:
                raise HarvestError(
                    f"co-run samples at {sms} inference SMs need solo samples at {sms} SMs "
                    "(stage 2 scales the stage-1 prediction)"
                )
        pairs = zip(colo_samples, infer_sms, strict=True)
        solo_ms = np.array([solo.predict_ms(sms, s.batch_size, s.seq_len) for s, sms in pairs])
        colo = ColoModel.fit(
            np.array([grid.ratio(sms) for sms in infer_sms]),
            np.array([s.ft_sm_ratio for s in colo_samples]),
            np.array([s.latency_ms for s in colo_samples]) / solo_ms,
            config,
        )
        return cls(grid, solo, colo)

    def score(self, samples: list[Sample]) -> tuple[FitMetrics, FitMetrics]:
        """(solo, co-run) prediction errors over `samples`."""
        solo = [s for s in samples if s.is_solo]
        colo = [s for s in samples if not s.is_solo]
        if colo and self.colo is None:
            raise HarvestError(f"{len(colo)} co-run samples given, but this profile has no co-run model")
        return (
            FitMetrics.of([self.predict_sample_ms(s) for s in solo], [s.latency_ms for s in solo]),
            FitMetrics.of([self.predict_sample_ms(s) for s in colo], [s.latency_ms for s in colo]),
        )

    def to_dict(self) -> dict:
        return {"solo": self.solo.to_dict(), "colo": None if self.colo is None else self.colo.to_dict()}

    @classmethod
    def from_dict(cls, r: JsonReader, grid: PartitionGrid) -> "LatencyModel":
        colo = ColoModel.from_dict(r.child("colo")) if r.has("colo") else None
        try:
            return cls(grid, SoloModel.from_dict(r.child("solo")), colo)
        except HarvestError as e:
            raise HarvestError(f"{r.source}: {r.where}: {e}") from None
