"""Prediction error over a set of samples, in percent (HARLI reports MAPE and the worst case)."""

from dataclasses import dataclass

from predictor.json_reader import JsonReader


@dataclass(frozen=True, slots=True)
class FitMetrics:
    n: int
    mape: float | None
    """Mean absolute percentage error; None when there were no samples."""
    max_ape: float | None
    """Worst absolute percentage error."""

    @classmethod
    def of(cls, predicted_ms: list[float], measured_ms: list[float]) -> "FitMetrics":
        if not measured_ms:
            return cls(0, None, None)
        ape = [abs(p - m) / m * 100.0 for p, m in zip(predicted_ms, measured_ms, strict=True)]
        return cls(len(ape), sum(ape) / len(ape), max(ape))

    def to_dict(self) -> dict:
        return {"n": self.n, "mape": self.mape, "max_ape": self.max_ape}

    @classmethod
    def from_dict(cls, r: JsonReader) -> "FitMetrics":
        n = r.integer("n", 0)
        mape, max_ape = r.optional_number("mape", 0.0), r.optional_number("max_ape", 0.0)
        if (n == 0) != (mape is None) or (mape is None) != (max_ape is None):
            raise r.fail("n", "must be 0 exactly when mape and max_ape are null")
        return cls(n, mape, max_ape)
