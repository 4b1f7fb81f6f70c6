"""Checkpoints under output_dir/checkpoint-<step>: a PEFT adapter, optimizer + scheduler state, data position.

Written to a temporary directory and renamed into place, so a kill mid-save never leaves a half checkpoint
that `latest()` would pick.

Deferred imports: the training libraries (llamafactory, transformers, peft, safetensors) are imported by the functions
that use them, so importing this module does not pay their seconds of start-up.
"""

import json
import shutil
from pathlib import Path
from typing import Any

import torch

STATE_FILE = "harvest_state.json"
TRAIN_STATE_FILE = "harvest_train_state.pt"
PREFIX = "checkpoint-"


class CheckpointStore:
    def __init__(self, output_dir: str | Path) -> None:
        self.output_dir = Path(output_dir)

    def save(self, peft_model, step: int, position: dict[str, Any], train_state: dict[str, Any]) -> Path:
        final_dir = self.output_dir / f"{PREFIX}{step}"
        tmp_dir = self.output_dir / f".tmp-{PREFIX}{step}"
        shutil.rmtree(tmp_dir, ignore_errors=True)
        tmp_dir.mkdir(parents=True)
        peft_model.save_pretrained(tmp_dir)
        torch.save(train_state, tmp_dir / TRAIN_STATE_FILE)
        (tmp_dir / STATE_FILE).write_text(json.dumps({"global_step": step, **position}, indent=2) + "\n")
        shutil.rmtree(final_dir, ignore_errors=True)
        tmp_dir.rename(final_dir)
        return final_dir

    def checkpoints(self) -> list[Path]:
        """harvest checkpoints in output_dir, oldest step first."""
        found = [
            (int(path.name[len(PREFIX) :]), path)
            for path in self.output_dir.glob(f"{PREFIX}*")
            if path.name[len(PREFIX) :].isdigit() and (path / STATE_FILE).is_file()
        ]
        return [path for _, path in sorted(found)]

    def latest(self) -> Path | None:
        found = self.checkpoints()
        return found[-1] if found else None

    def remove_all(self) -> None:
        for path in self.checkpoints():
            shutil.rmtree(path)

    @staticmethod
    def load(checkpoint_dir: Path, peft_model) -> tuple[dict[str, Any], dict[str, Any]]:
        """Load the adapter weights into `peft_model`; return (position, train_state)."""
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        weights = load_file(checkpoint_dir / "adapter_model.safetensors")
        result = set_peft_model_state_dict(peft_model, weights)
        missing_lora = [key for key in getattr(result, "missing_keys", []) if "lora_" in key]
        if missing_lora:
            raise ValueError(f"checkpoint {checkpoint_dir} lacks adapter weights {missing_lora[:3]}")
        position = json.loads((checkpoint_dir / STATE_FILE).read_text())
        train_state = torch.load(checkpoint_dir / TRAIN_STATE_FILE, weights_only=False)
        return position, train_state
