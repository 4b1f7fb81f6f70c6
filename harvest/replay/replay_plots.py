"""PNG plots of a results.json, after HARLI's Fig. 11a (TPOT CDF), 11b (finetune throughput), 14 (SM split
and step latency over time) and 13 (KV / finetune memory and window size over time).

Deferred imports: matplotlib (and its Agg backend, chosen before pyplot) only when plots are written.
"""

from pathlib import Path

import numpy as np

COLORS = {
    "separate": "tab:gray",
    "static": "tab:orange",
    "harvest": "tab:green",
    "temporal": "tab:blue",
    "live": "tab:green",
}
GB = 1e9


def write_plots(results: dict, out_dir: str | Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ok = {name: p for name, p in results["policies"].items() if p.get("status") == "ok"}
    title = _title(results)
    focus = next((n for n in ("harvest", "live", "temporal", "static", "separate") if n in ok), None)
    paths = [
        _tpot_cdf(ok, results, title, out_dir / "tpot_cdf.png"),
        _finetune_bars(ok, title, out_dir / "finetune_throughput.png"),
    ]
    if focus:
        paths.append(_split_and_latency(focus, ok[focus], results, title, out_dir / "sm_split_latency.png"))
        pool_bytes = results.get("memory", {}).get("kv_pool_bytes")
        paths.append(_memory_and_window(focus, ok[focus], title, pool_bytes, out_dir / "memory_window.png"))
    return paths


def _title(results: dict) -> str:
    trace = results["trace"]["name"]
    if results["mode"] == "live":
        return f"live replay of {trace} against {results.get('target', 'a worker')}"
    profile = results["profile"]
    label = "SYNTHETIC profile, not measured: " if profile["is_synthetic"] else "profile: "
    return f"simulated replay of {trace} - {label}{profile['device']}"


def _tpot_cdf(ok: dict, results: dict, title: str, path: Path) -> Path:
    import matplotlib.pyplot as plt

    target = results["config"]["tpot_slo_ms"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, key, label in (
        (axes[0], "step_latency_cdf_ms", "decode step latency (ms)"),
        (axes[1], "tpot_cdf_ms", "per-request TPOT (ms)"),
    ):
        for name, p in ok.items():
            values = p.get(key) or []
            if values:
                ax.plot(values, np.linspace(0, 1, len(values)), label=name, color=COLORS.get(name))
        ax.axvline(target, color="red", linestyle="--", label=f"target {target:g} ms")
        ax.set_xlabel(label)
        ax.set_ylabel("CDF")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title, fontsize=9)
    return _save(fig, path)


def _finetune_bars(ok: dict, title: str, path: Path) -> Path:
    import matplotlib.pyplot as plt

    names = [n for n, p in ok.items() if p.get("finetune", {}).get("tokens_per_s") is not None]
    rates = [ok[n]["finetune"]["tokens_per_s"] for n in names]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    bars = ax.bar(names, rates, color=[COLORS.get(n, "tab:purple") for n in names])
    for bar, name in zip(bars, names):
        ratio = ok[name]["finetune"].get("ratio_to_separate")
        label = f"{bar.get_height():.0f}" + (f"\n{ratio:.2f}x separate" if ratio else "")
        ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("finetune tokens/s (whole fleet)")
    ax.set_title(title, fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    if not names:
        ax.text(0.5, 0.5, "no finetune throughput measured", ha="center", transform=ax.transAxes)
    return _save(fig, path)


def _series(p: dict, key: str) -> tuple[np.ndarray, np.ndarray]:
    s = p.get("series", {})
    t = np.array(s.get("t_s", []), dtype=float)
    v = np.array([np.nan if x is None else x for x in s.get(key, [])], dtype=float)
    return (t, v) if len(v) == len(t) else (t, np.full(len(t), np.nan))


def _split_and_latency(name: str, p: dict, results: dict, title: str, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 6), sharex=True)
    t, infer = _series(p, "infer_sms")
    _, ft = _series(p, "ft_sms")
    if np.isfinite(infer).any():
        top.plot(t, infer, label="inference SMs (mean per bin)", color="tab:blue")
        top.plot(t, ft, label="finetune SMs (mean per bin)", color="tab:green")
        top.set_ylabel("SMs")
    else:
        _, batch = _series(p, "batch_size")
        top.plot(t, batch, label="batch size (mean per bin)", color="tab:blue")
        top.set_ylabel("batch size")
    top.legend(loc="upper right")
    top.grid(alpha=0.3)
    _, mean_ms = _series(p, "step_latency_ms")
    _, max_ms = _series(p, "step_latency_ms_max")
    bottom.plot(t, mean_ms, label="step latency, mean per bin", color="tab:blue")
    bottom.plot(t, max_ms, label="step latency, max per bin", color="tab:purple", alpha=0.6)
    bottom.axhline(results["config"]["tpot_slo_ms"], color="red", linestyle="--", label="target")
    bottom.set_ylabel("ms")
    bottom.set_xlabel("time (s)")
    bottom.legend(loc="upper right")
    bottom.grid(alpha=0.3)
    fig.suptitle(f"{name}: SM split and decode step latency - {title}", fontsize=9)
    return _save(fig, path)


def _memory_and_window(name: str, p: dict, title: str, pool_bytes: int | None, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(12, 4.5))
    t, kv = _series(p, "kv_bytes")
    if np.isfinite(kv).any():
        _, lent = _series(p, "lent_bytes")
        ax.plot(t, kv / GB, label="KV cache in use (GB)", color="tab:blue")
        ax.plot(t, lent / GB, label="finetune memory, lent from KV (GB)", color="tab:green")
        if pool_bytes:
            ax.axhline(pool_bytes / GB, color="gray", linestyle=":", label="KV pool (GB)")
        ax.set_ylabel("GB")
    else:
        _, kv_tokens = _series(p, "kv_tokens")
        ax.plot(t, kv_tokens, label="KV tokens in use", color="tab:blue")
        ax.set_ylabel("tokens")
    ax.set_xlabel("time (s)")
    ax.grid(alpha=0.3)
    twin = ax.twinx()
    _, window = _series(p, "window_layers")
    twin.plot(t, window, label="finetune window (layers)", color="tab:orange", alpha=0.7)
    twin.set_ylabel("window layers")
    twin.set_ylim(0, (np.nanmax(window) if np.isfinite(window).any() else 1) * 1.1 + 1)
    lines = ax.get_legend_handles_labels()
    more = twin.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], loc="upper right")
    fig.suptitle(f"{name}: memory and finetune window - {title}", fontsize=9)
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
