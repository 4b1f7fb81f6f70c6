"""Whether a submitted job can fit this worker's memory at all: a floor, not a plan. A job over it would only
fail inside the worker after its build; one under it may still wait for memory, and says so in its state."""

import json
from pathlib import Path

from base.errors import HarvestError

BYTES_PER_ACTIVATION = 4
"""fp32: what a CPU job computes in; a bf16 GPU job needs half, so the floor stays a floor either way."""


def activation_floor_bytes(llamafactory, model_config: dict) -> int:
    """One row of one micro-batch, the least a unit can take (units slice micro-batches by rows): its logits
    (cutoff_len x vocab) and the hidden state every decoder layer keeps for the backward pass."""
    cutoff_len = llamafactory.data_args.cutoff_len
    per_token = model_config["vocab_size"] + model_config["hidden_size"] * model_config["num_hidden_layers"]
    return cutoff_len * per_token * BYTES_PER_ACTIVATION


def weight_bytes(model_dir: Path) -> int:
    return sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))


def check_fits(llamafactory, served_model_path: str | None, free_bytes: int) -> None:
    """Refuse a job that cannot fit `free_bytes` (host memory on a CPU worker, the device's free memory on a
    GPU one): its activation floor, plus its frozen weights where it does not share the served model's. A model
    named by hub id (no local config) is not judged here."""
    model_dir = Path(str(llamafactory.model_args.model_name_or_path))
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        return
    need = activation_floor_bytes(llamafactory, json.loads(config_path.read_text()))
    is_served = served_model_path is not None and model_dir.resolve() == Path(served_model_path).resolve()
    if not is_served:
        need += weight_bytes(model_dir)
    if need > free_bytes:
        raise HarvestError(
            f"cutoff_len: the job needs at least {need / 2**30:.1f} GiB (one row of cutoff_len "
            f"{llamafactory.data_args.cutoff_len}{'' if is_served else ' plus its frozen weights'}), this worker has "
            f"{free_bytes / 2**30:.1f} GiB free")
