"""Turn simulated (or live) steps and requests into one policy's entry of results.json."""

import math

import numpy as np

from harvest.replay.decode_simulator import DeviceRun

CDF_POINTS = 201
SCHEMA_VERSION = 1
"""Of results.json, live and simulated (the schema: eval/README.md)."""


def percentiles(values: np.ndarray, prefix: str, qs=(50, 90, 99)) -> dict:
    if not len(values):
        return {f"{prefix}_p{q}": None for q in qs}
    return {f"{prefix}_p{q}": round(float(np.percentile(values, q)), 4) for q in qs}


def decode_metrics(
    step_latency_ms: np.ndarray,
    step_batch_size: np.ndarray,
    tpot_ms: np.ndarray,
    queue_delay_s: np.ndarray,
    tpot_slo_ms: float,
) -> dict:
    num_steps = len(step_latency_ms)
    return {
        "num_steps": num_steps,
        "num_requests": len(tpot_ms),
        "num_tokens": int(step_batch_size.sum()),
        "step_slo_attainment": float(np.mean(step_latency_ms <= tpot_slo_ms)) if num_steps else None,
        **percentiles(step_latency_ms, "step_latency_ms"),
        "step_latency_ms_max": round(float(step_latency_ms.max()), 4) if num_steps else None,
        **percentiles(tpot_ms, "tpot_ms"),
        "request_tpot_slo_attainment": float(np.mean(tpot_ms <= tpot_slo_ms)) if len(tpot_ms) else None,
        **percentiles(queue_delay_s, "queue_delay_s", (50, 99)),
        "mean_batch_size": round(float(step_batch_size.mean()), 3) if num_steps else None,
    }


def cdf(values: np.ndarray) -> list[float]:
    """Values at CDF_POINTS evenly spaced quantiles from 0 to 1: enough to draw the CDF."""
    if not len(values):
        return []
    return [round(float(v), 4) for v in np.quantile(values, np.linspace(0.0, 1.0, CDF_POINTS))]


def binned_series(t_s: np.ndarray, span_s: float, num_points: int, **columns: np.ndarray) -> dict:
    """Per-bin means of step columns over [0, span_s]; a bin with no step (idle) is null."""
    edges = np.linspace(0.0, max(span_s, 1e-9), num_points + 1)
    index = np.clip(np.searchsorted(edges, t_s, side="right") - 1, 0, num_points - 1)
    counts = np.bincount(index, minlength=num_points)
    out = {"t_s": [round(float(x), 3) for x in (edges[:-1] + edges[1:]) / 2]}
    for name, values in columns.items():
        sums = np.bincount(index, weights=values.astype(np.float64), minlength=num_points)
        out[name] = [round(float(s / c), 4) if c else None for s, c in zip(sums, counts)]
    maxima = np.full(num_points, -np.inf)
    if "step_latency_ms" in columns and len(t_s):
        np.maximum.at(maxima, index, columns["step_latency_ms"])
        out["step_latency_ms_max"] = [round(float(m), 4) if math.isfinite(m) else None for m in maxima]
    return out


def summarize_policy(
    name: str,
    runs: list[DeviceRun],
    finetune_device_tokens_per_s: float,
    span_s: float,
    kv_bytes_per_token: int,
    tpot_slo_ms: float,
    samples_per_token: float | None,
    num_points: int,
) -> dict:
    """One policy over its fleet: `runs` are its decode devices (extended to span_s), plus a dedicated
    finetune device running at `finetune_device_tokens_per_s` (0 when the policy has none)."""
    for run in runs:
        run.extend_to(span_s)
    latency = np.concatenate([r.step_latency_ms for r in runs])
    batch = np.concatenate([r.step_batch_size for r in runs])
    tpot_ms = np.concatenate([(r.finish_s - r.admit_s) / r.num_tokens * 1e3 for r in runs])
    queue = np.concatenate([r.admit_s - r.arrival_s for r in runs])
    decode_device_tokens = sum(r.ft_tokens for r in runs)
    total_tokens = decode_device_tokens + finetune_device_tokens_per_s * span_s
    first = runs[0]
    return {
        "status": "ok",
        "reason": None,
        "num_decode_devices": len(runs),
        "has_finetune_device": finetune_device_tokens_per_s > 0,
        "decode": {**decode_metrics(latency, batch, tpot_ms, queue, tpot_slo_ms), "makespan_s": round(span_s, 3)},
        "finetune": {
            "tokens_per_s": total_tokens / span_s,
            "samples_per_s": None if samples_per_token is None else total_tokens / span_s * samples_per_token,
            "decode_device_tokens_per_s": decode_device_tokens / span_s / len(runs),
            "finetune_device_tokens_per_s": finetune_device_tokens_per_s,
            "ratio_to_separate": None,
            "ratio_to_static": None,
        },
        "co_run_step_fraction": float(np.mean(np.concatenate([r.step_ft_sms for r in runs]) > 0))
        if len(latency)
        else 0.0,
        "tpot_cdf_ms": cdf(tpot_ms),
        "step_latency_cdf_ms": cdf(latency),
        "series": binned_series(
            first.step_end_s,
            span_s,
            num_points,
            step_latency_ms=first.step_latency_ms,
            infer_sms=first.step_infer_sms,
            ft_sms=first.step_ft_sms,
            batch_size=first.step_batch_size,
            kv_bytes=first.step_kv_tokens * kv_bytes_per_token,
            lent_bytes=first.step_ft_bytes,
            window_layers=first.step_window_layers,
        ),
    }
