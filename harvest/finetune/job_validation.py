"""One check of a finetune job, shared by `harvest finetune` and `harvest serve --finetune`, done before
anything starts (no worker, no model load, no dataset tokenization).

It covers what LlamaFactory's own parser lets through and the job would only trip over later, inside the
worker: values of the wrong type or out of range (`lora_rank: "eight"`, `lora_rank: -1`), an output_dir
that cannot be created, checkpoints that do or do not match --resume, and harvest's own knobs. Each error
is a HarvestError naming the key or flag.
"""

import os
from pathlib import Path
from typing import Any

import torch

from base.errors import HarvestError
from harvest.finetune.checkpoint_store import CheckpointStore
from harvest.finetune.finetune_config import FinetuneConfig
from harvest.finetune.llamafactory_args import LlamaFactoryArgs


def finetune_config(flag_names: dict[str, str], **values) -> FinetuneConfig:
    """FinetuneConfig from CLI values; an invalid one is a HarvestError naming the flag it came from
    (`flag_names` maps field names to the caller's flags, e.g. num_window_layers -> --window)."""
    try:
        config = FinetuneConfig(**values)
    except ValueError as e:
        message = str(e)
        field = message.split(" ", 1)[0]
        raise HarvestError(message.replace(field, flag_names.get(field, field), 1)) from None
    _check_device(config.device, flag_names.get("device", "device"))
    return config


def check_job(yaml_path: str | Path, config: FinetuneConfig, overrides: dict[str, Any] | None = None,
              model_path: str | None = None, resume_flag: str = "--resume") -> LlamaFactoryArgs:
    """Parse and check the whole job; returns the parsed job (LlamaFactory's own parse runs once)."""
    llamafactory = LlamaFactoryArgs.from_yaml(yaml_path, overrides, model_path)
    check_output_dir(llamafactory, config.resume, resume_flag)
    return llamafactory


def check_output_dir(llamafactory: LlamaFactoryArgs, resume: bool, resume_flag: str = "--resume") -> None:
    output_dir = llamafactory.output_dir
    if output_dir.exists() and not output_dir.is_dir():
        raise HarvestError(f"output_dir: {str(output_dir)!r} exists and is not a directory")
    ancestor = next(p for p in [output_dir, *output_dir.parents] if p.exists())
    if not ancestor.is_dir():
        raise HarvestError(f"output_dir: {str(output_dir)!r} cannot be created: {str(ancestor)!r} is a file")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise HarvestError(f"output_dir: {str(output_dir)!r} cannot be created: {str(ancestor)!r} is not writable")
    has_checkpoint = output_dir.is_dir() and CheckpointStore(output_dir).latest() is not None
    if resume and not has_checkpoint:
        raise HarvestError(f"{resume_flag}: no harvest checkpoint in output_dir {str(output_dir)!r}")
    if not resume and has_checkpoint and not llamafactory.raw.get("overwrite_output_dir", False):
        raise HarvestError(f"output_dir: {str(output_dir)!r} holds checkpoints of an earlier run; "
                           f"pass {resume_flag} to continue it or set overwrite_output_dir: true")


def _check_device(device: str, flag: str) -> None:
    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise HarvestError(f"{flag} {device!r} is not a torch device (cpu, cuda, cuda:1)") from None
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise HarvestError(f"{flag} {device!r}: this host has no CUDA GPU")
