"""Stage 2 (HARLI eq. 3): co-run decode latency = slowdown(infer ratio, ft ratio) * stage-1 solo latency.

All forms share slowdown = a1 + b1 * r_infer + k1 * r_ft + m1 * r_infer * r_ft and differ in which
coefficients are free. Eq. 3 as printed (b1 * r_infer + k1 * r_ft) cannot give slowdown 1 at r_ft = 0
for every partition with one b1, so the forms that pin a1 = 1 (the bandwidth argument of eq. 5: the
slowdown is 1 plus the finetune job's extra memory traffic, which grows with its SM share) are fitted
beside it, and cross-validated MAPE picks one by the one-standard-error rule: the simplest form whose
CV MAPE is within one standard error of the best, so noise does not buy an extra term. Every form's
coefficients and errors stay in the profile as the record of the comparison.
At ft_sms = 0 the prediction is the solo one by definition, whatever the form.

Deferred imports: scikit-learn only when a model is fitted; loading a fitted profile needs none.
"""

from dataclasses import dataclass

import numpy as np

from base.errors import HarvestError
from predictor.config import PredictorConfig
from predictor.json_reader import JsonReader

COEFFICIENT_NAMES = ("a1", "b1", "k1", "m1")

# form -> (free coefficients among b1, k1, m1; is a1 free (else fixed to a1 = 1 or 0)).
FORMS = {
    "eq5_bandwidth": (("k1",), False),
    "eq5_bandwidth_infer": (("k1", "m1"), False),
    "eq3_intercept": (("b1", "k1"), True),
    "eq3_as_printed": (("b1", "k1"), False),
}
# Fixed a1 of the forms that do not fit it: eq. 3 as printed has no constant term.
FIXED_A1 = {"eq5_bandwidth": 1.0, "eq5_bandwidth_infer": 1.0, "eq3_as_printed": 0.0}
# Simplest first (fewest free coefficients; at a tie, the form that gives solo at ft = 0): the
# one-standard-error rule keeps the first form within one SE of the best.
FORM_ORDER = ("eq5_bandwidth", "eq5_bandwidth_infer", "eq3_as_printed", "eq3_intercept")


@dataclass(frozen=True, slots=True)
class FormFit:
    form: str
    coefficients: dict[str, float]
    cv_mape: float
    """Cross-validated mean absolute percentage error of the co-run latency."""
    cv_mape_se: float
    """Standard error of cv_mape (over samples)."""
    fit_mape: float
    """The same error on the samples it was fitted to."""


@dataclass(frozen=True, slots=True)
class ColoModel:
    form: str
    a1: float
    b1: float
    k1: float
    m1: float
    candidates: tuple[FormFit, ...]

    def __post_init__(self) -> None:
        if self.form not in FORMS:
            raise HarvestError(f"unknown co-run form {self.form!r}; known: {', '.join(FORMS)}")

    def slowdown(self, infer_ratio: float, ft_ratio: float) -> float:
        return self.a1 + self.b1 * infer_ratio + self.k1 * ft_ratio + self.m1 * infer_ratio * ft_ratio

    @classmethod
    def fit(
        cls, infer_ratio: np.ndarray, ft_ratio: np.ndarray, ratio: np.ndarray, config: PredictorConfig
    ) -> "ColoModel":
        """Fit from co-run samples: `ratio` = measured co-run latency / stage-1 solo prediction."""
        from sklearn.model_selection import (
            KFold,  # lazily: see solo_model._fit_partition
        )

        n = len(ratio)
        if n < config.min_colo_samples:
            raise HarvestError(f"stage 2 needs >= {config.min_colo_samples} co-run samples, got {n}")
        folds = list(KFold(min(config.num_cv_folds, n), shuffle=True, random_state=0).split(ratio))
        fits = []
        for form in FORM_ORDER:
            coefficients = _fit_form(form, infer_ratio, ft_ratio, ratio)
            held_out = np.empty(n)
            for train, test in folds:
                c = _fit_form(form, infer_ratio[train], ft_ratio[train], ratio[train])
                held_out[test] = _slowdown(c, infer_ratio[test], ft_ratio[test])
            ape = np.abs(held_out - ratio) / ratio * 100.0
            fit_pred = _slowdown(coefficients, infer_ratio, ft_ratio)
            fits.append(
                FormFit(
                    form, coefficients, float(ape.mean()), float(ape.std(ddof=1) / np.sqrt(n)), _mape(fit_pred, ratio)
                )
            )
        lowest = min(fits, key=lambda f: f.cv_mape)
        best = next(f for f in fits if f.cv_mape <= lowest.cv_mape + lowest.cv_mape_se)
        return cls(best.form, **best.coefficients, candidates=tuple(fits))

    def to_dict(self) -> dict:
        return {
            "form": self.form,
            "coefficients": {name: getattr(self, name) for name in COEFFICIENT_NAMES},
            "candidates": [
                {
                    "form": f.form,
                    "coefficients": f.coefficients,
                    "cv_mape": f.cv_mape,
                    "cv_mape_se": f.cv_mape_se,
                    "fit_mape": f.fit_mape,
                }
                for f in self.candidates
            ],
        }

    @classmethod
    def from_dict(cls, r: JsonReader) -> "ColoModel":
        coefficients = r.child("coefficients")
        candidates = tuple(
            FormFit(
                c.text("form"),
                {name: c.child("coefficients").number(name) for name in COEFFICIENT_NAMES},
                c.number("cv_mape", 0.0),
                c.number("cv_mape_se", 0.0),
                c.number("fit_mape", 0.0),
            )
            for c in r.children("candidates")
        )
        form = r.text("form")
        if form not in FORMS:
            raise r.fail("form", f"must be one of {', '.join(FORMS)}, got {form!r}")
        return cls(form, *(coefficients.number(name) for name in COEFFICIENT_NAMES), candidates=candidates)


def _fit_form(form: str, infer_ratio: np.ndarray, ft_ratio: np.ndarray, ratio: np.ndarray) -> dict[str, float]:
    from sklearn.linear_model import LinearRegression

    free, is_a1_free = FORMS[form]
    columns = {"b1": infer_ratio, "k1": ft_ratio, "m1": infer_ratio * ft_ratio}
    x = np.column_stack([columns[name] for name in free])  # x: [num_samples, num_free]
    a1 = 0.0 if is_a1_free else FIXED_A1[form]
    # Weights 1/ratio^2: the residual (pred - ratio) / ratio is the relative error of the co-run latency.
    reg = LinearRegression(fit_intercept=is_a1_free).fit(x, ratio - a1, sample_weight=1.0 / ratio**2)
    coefficients = dict.fromkeys(COEFFICIENT_NAMES, 0.0)
    coefficients["a1"] = float(reg.intercept_) if is_a1_free else a1
    coefficients.update({name: float(v) for name, v in zip(free, reg.coef_, strict=True)})
    return coefficients


def _slowdown(c: dict[str, float], infer_ratio: np.ndarray, ft_ratio: np.ndarray) -> np.ndarray:
    return c["a1"] + c["b1"] * infer_ratio + c["k1"] * ft_ratio + c["m1"] * infer_ratio * ft_ratio


def _mape(pred: np.ndarray, actual: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - actual) / actual) * 100.0)
