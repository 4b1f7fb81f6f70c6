"""Stage 1 (HARLI eq. 2): solo decode latency per inference partition, with the small-batch plateau.

HARLI sees batch sizes <= 4 take the same time: serving frameworks pad the batch for tensor cores, so
the weight GEMMs run on max(bs, p) rows while attention still reads only the real bs * seq_len KV tokens.
The model is therefore lat = max(bs, p) * b0 + c0 + bs * seq_len * k0, and the knot p is fitted too:
each padding quantum in PredictorConfig.plateau_candidates is tried and the one with the least relative
squared error over all partitions is kept (p = 1 is eq. 2 exactly). Padding is a property of the
framework, not of the partition, so one p is shared by every partition.

Deferred imports: scikit-learn only when a model is fitted; loading a fitted profile needs none.
"""

from dataclasses import dataclass, field

import numpy as np

from base.errors import HarvestError
from predictor.config import PredictorConfig
from predictor.json_reader import JsonReader
from predictor.partition_grid import PartitionGrid
from predictor.samples import Sample


@dataclass(frozen=True, slots=True)
class SoloCoefficients:
    infer_sms: int
    b0_ms: float
    """Cost per (padded) request in the batch: the batch-size slope of the weight GEMMs."""
    c0_ms: float
    """Fixed cost of a step: reading the weights, launches."""
    k0_ms: float
    """Cost per KV token read by attention."""

    def latency_ms(self, plateau_batch_size: int, batch_size: int, seq_len: float) -> float:
        return self.b0_ms * max(batch_size, plateau_batch_size) + self.c0_ms + self.k0_ms * batch_size * seq_len


@dataclass(frozen=True, slots=True)
class SoloModel:
    plateau_batch_size: int
    partitions: tuple[SoloCoefficients, ...]
    plateau_rel_rmse: dict[int, float]
    """Relative RMS error of the fit with each candidate knot: the record of why this one was kept."""
    _by_sms: dict[int, SoloCoefficients] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.plateau_batch_size < 1:
            raise HarvestError(f"plateau_batch_size must be >= 1, got {self.plateau_batch_size}")
        if not self.partitions:
            raise HarvestError("the solo model needs at least one partition")
        object.__setattr__(self, "_by_sms", {c.infer_sms: c for c in self.partitions})
        for c in self.partitions:
            if c.b0_ms < 0 or c.k0_ms < 0:
                raise HarvestError(f"solo model at {c.infer_sms} SMs: b0 and k0 must be >= 0, got {c.b0_ms}, {c.k0_ms}")
            if c.latency_ms(self.plateau_batch_size, 1, 0.0) <= 0:
                raise HarvestError(f"solo model at {c.infer_sms} SMs predicts a latency <= 0 for batch size 1")

    @property
    def infer_options(self) -> tuple[int, ...]:
        return tuple(sorted(self._by_sms))

    def coefficients(self, infer_sms: int) -> SoloCoefficients:
        try:
            return self._by_sms[infer_sms]
        except KeyError:
            raise HarvestError(f"no solo model for {infer_sms} inference SMs; profiled: {self.infer_options}") from None

    def predict_ms(self, infer_sms: int, batch_size: int, seq_len: float) -> float:
        return self.coefficients(infer_sms).latency_ms(self.plateau_batch_size, batch_size, seq_len)

    @classmethod
    def fit(cls, samples: list[Sample], grid: PartitionGrid, config: PredictorConfig) -> "SoloModel":
        by_sms: dict[int, list[Sample]] = {}
        for s in samples:
            sms = grid.to_sms(s.infer_sm_ratio, "infer_sm_ratio")
            if sms not in grid.infer_options():
                raise HarvestError(f"infer_sm_ratio {s.infer_sm_ratio} ({sms} SMs) is not a partition of {grid}")
            by_sms.setdefault(sms, []).append(s)
        if not by_sms:
            raise HarvestError("no solo samples (ft_sm_ratio = 0): stage 1 cannot be fitted")
        arrays = {sms: _arrays(group) for sms, group in sorted(by_sms.items())}
        for sms, (bs, kv, _) in arrays.items():
            if len(np.unique(np.stack([bs, kv]), axis=1).T) < 3 or len(np.unique(bs)) < 2:
                raise HarvestError(
                    f"solo samples at {sms} SMs: need >= 3 distinct (batch_size, seq_len) points over >= 2 batch sizes"
                )
        fits: dict[int, tuple[float, list[SoloCoefficients]]] = {}
        for p in config.plateau_candidates:
            fitted = [_fit_partition(sms, p, *a) for sms, a in arrays.items()]
            if all(f is not None for f in fitted):
                fits[p] = (_rel_rmse(fitted, arrays, p), fitted)
        if not fits:
            raise HarvestError("solo samples too few batch sizes to fit any plateau candidate")
        best = min(fits, key=lambda p: fits[p][0])
        return cls(best, tuple(fits[best][1]), {p: rmse for p, (rmse, _) in fits.items()})

    def to_dict(self) -> dict:
        return {
            "plateau_batch_size": self.plateau_batch_size,
            "plateau_rel_rmse": {str(p): r for p, r in self.plateau_rel_rmse.items()},
            "partitions": [
                {"infer_sms": c.infer_sms, "b0_ms": c.b0_ms, "c0_ms": c.c0_ms, "k0_ms": c.k0_ms}
                for c in self.partitions
            ],
        }

    @classmethod
    def from_dict(cls, r: JsonReader) -> "SoloModel":
        partitions = tuple(
            SoloCoefficients(p.integer("infer_sms", 1), p.number("b0_ms"), p.number("c0_ms"), p.number("k0_ms"))
            for p in r.children("partitions")
        )
        rmse = r.child("plateau_rel_rmse")
        knots = {}
        for key in rmse.obj:
            if not key.isdigit():
                raise rmse.fail(key, "must be keyed by a batch size")
            knots[int(key)] = rmse.number(key, 0.0)
        if len({c.infer_sms for c in partitions}) != len(partitions):
            raise r.fail("partitions", "lists an infer_sms twice")
        return cls(r.integer("plateau_batch_size", 1), partitions, knots)


def _arrays(group: list[Sample]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    bs = np.array([s.batch_size for s in group], dtype=float)
    kv = np.array([s.num_kv_tokens for s in group], dtype=float)
    lat = np.array([s.latency_ms for s in group], dtype=float)
    return bs, kv, lat


def _fit_partition(sms: int, p: int, bs: np.ndarray, kv: np.ndarray, lat: np.ndarray) -> SoloCoefficients | None:
    # Imported here: sklearn takes ~3 s to import and the runtime only loads fitted profiles.
    from sklearn.linear_model import LinearRegression

    x = np.column_stack([np.maximum(bs, p), kv])  # x: [num_samples, (padded batch, kv tokens)]
    if np.linalg.matrix_rank(np.column_stack([x, np.ones(len(x))])) < 3:
        return None
    # Weights 1/lat^2 make least squares minimise relative error, the quantity MAPE and the SLO care about.
    reg = LinearRegression(positive=True).fit(x, lat, sample_weight=1.0 / lat**2)
    b0, k0 = (float(v) for v in reg.coef_)
    return SoloCoefficients(sms, b0, float(reg.intercept_), k0)


def _rel_rmse(fitted: list[SoloCoefficients], arrays: dict, p: int) -> float:
    errors = []
    for c in fitted:
        bs, kv, lat = arrays[c.infer_sms]
        pred = c.b0_ms * np.maximum(bs, p) + c.c0_ms + c.k0_ms * kv
        errors.append((pred - lat) / lat)
    return float(np.sqrt(np.mean(np.concatenate(errors) ** 2)))
