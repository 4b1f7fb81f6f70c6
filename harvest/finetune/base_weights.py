"""Which base weights the job computes with: a copy of its own, or the served model's resident weights.

Sharing needs the job's base model to be the served model: same config and same weight bytes, checked by a
fingerprint, not by the path (a path can be a different snapshot or a symlink to the same one). Shared mode
(computing with SGLang's resident weights in place) is not built yet; every job runs in copy mode and its
stats say why.
"""

import hashlib
import json
from pathlib import Path

WEIGHT_PATTERNS = ("*.safetensors", "*.bin")


def model_fingerprint(model_dir: str | Path) -> str:
    """sha256 over the model's config (as parsed JSON, keys sorted, its own path left out) and every weight
    file's bytes, in name order."""
    model_dir = Path(model_dir)
    digest = hashlib.sha256()
    config = json.loads((model_dir / "config.json").read_text())
    config.pop("_name_or_path", None)
    digest.update(json.dumps(config, sort_keys=True).encode())
    for path in sorted(p for pattern in WEIGHT_PATTERNS for p in model_dir.glob(pattern)):
        digest.update(path.name.encode())
        with path.open("rb") as f:
            digest.update(hashlib.file_digest(f, "sha256").digest())
    return digest.hexdigest()


def base_weight_mode(job_model_dir: str | Path, served_model_dir: str | Path | None) -> dict:
    """{mode, reason, bytes_saved, is_served_model} for the job's stats."""
    if served_model_dir is None:
        return {"mode": "copy", "reason": "no served model (a job outside a worker)", "bytes_saved": 0,
                "is_served_model": False}
    is_same = model_fingerprint(job_model_dir) == model_fingerprint(served_model_dir)
    reason = ("the job's base model is the served model, but shared mode is not built yet" if is_same else
              "the job's base model differs from the served model (config or weight fingerprint)")
    return {"mode": "copy", "reason": reason, "bytes_saved": 0, "is_served_model": is_same}
