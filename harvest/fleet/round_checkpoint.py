"""The fleet's adapter after a round, on disk: what the round's first member writes and a fleet restarted whole
resumes from (PEFT's adapter_model.safetensors, the round in its metadata and its folder's name)."""

from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from base.errors import HarvestError


def latest_round_checkpoint(checkpoint_dir: str | Path, names: list[str]) -> tuple[int, list[torch.Tensor]] | None:
    """(round, the adapter's tensors in `names` order) of the newest round written under checkpoint_dir; None if
    none. A checkpoint whose tensors are not these names is an error (another job's)."""
    rounds = sorted((int(p.parent.name.removeprefix("round-")), p)
                    for p in Path(checkpoint_dir).glob("round-*/adapter_model.safetensors")
                    if p.parent.name.removeprefix("round-").isdigit())
    if not rounds:
        return None
    round_number, path = rounds[-1]
    with safe_open(str(path), framework="pt") as f:
        if sorted(f.keys()) != sorted(names):
            raise HarvestError(f"{path}: not this job's adapter (its tensors differ)")
        return round_number, [f.get_tensor(name) for name in names]


def write_round_checkpoint(adapter: dict[str, torch.Tensor], round_number: int, checkpoint_dir: str | Path) -> Path:
    """The fleet's adapter after a round (not this worker's steps since), as PEFT's adapter_model.safetensors
    with the round in its metadata."""
    path = Path(checkpoint_dir) / f"round-{round_number}" / "adapter_model.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(adapter, str(path), metadata={"fleet_round": str(round_number)})
    return path
