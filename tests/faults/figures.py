"""The fault suite's figures: each case writes what it measured into a file of its own (xdist runs cases in
two processes at once), and the session's end merges them into one JSON file; the README's Reliability table
is made from it."""

import json
import os
import re
from datetime import UTC, datetime
from pathlib import Path

from harvest.profiler.profiled_device import cpu_model_name

FIGURES_PATH = Path(__file__).resolve().parents[2] / "runs" / "faults" / "figures.json"
CASES_DIR = FIGURES_PATH.parent / "cases"


def record(case: str, **figures) -> None:
    CASES_DIR.mkdir(parents=True, exist_ok=True)
    figures = {**figures, "date": datetime.now(UTC).isoformat(timespec="seconds")}
    path = CASES_DIR / (re.sub(r"[^A-Za-z0-9._-]+", "_", case) + ".json")
    path.write_text(json.dumps({"case": case, "figures": figures}, sort_keys=True))


def merge() -> dict:
    """Fold every case file into FIGURES_PATH (a case recorded again replaces its figures)."""
    data = json.loads(FIGURES_PATH.read_text()) if FIGURES_PATH.exists() else {}
    cases = data.setdefault("cases", {})
    for path in sorted(CASES_DIR.glob("*.json")):
        one = json.loads(path.read_text())
        cases[one["case"]] = one["figures"]
        path.unlink()
    data["machine"] = f"{cpu_model_name()}, {os.cpu_count()} cores, {_gpu_name()}"
    FIGURES_PATH.parent.mkdir(parents=True, exist_ok=True)
    FIGURES_PATH.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return data


def _gpu_name() -> str:
    import torch

    return f"GPU: {torch.cuda.get_device_name()}" if torch.cuda.is_available() else "no GPU"
