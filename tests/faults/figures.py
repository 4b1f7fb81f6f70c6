"""The fault suite's figures: each case records what it measured into one JSON file; the README's
Reliability table is made from it."""

import json
import os
from datetime import UTC, datetime
from pathlib import Path

from harvest.profiler.live_profile import cpu_model_name

FIGURES_PATH = Path(__file__).resolve().parents[2] / "runs" / "faults" / "figures.json"


def record(case: str, **figures) -> None:
    FIGURES_PATH.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(FIGURES_PATH.read_text()) if FIGURES_PATH.exists() else {}
    data["machine"] = f"{cpu_model_name()}, {os.cpu_count()} cores, {_gpu_name()}"
    data.setdefault("cases", {})[case] = {**figures, "date": datetime.now(UTC).isoformat(timespec="seconds")}
    FIGURES_PATH.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def _gpu_name() -> str:
    import torch

    return f"GPU: {torch.cuda.get_device_name()}" if torch.cuda.is_available() else "no GPU"
