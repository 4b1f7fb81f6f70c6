"""One check of a finetune job, shared by `harvest finetune` and `harvest serve --finetune`, done before
anything starts (no worker, no model load, no dataset tokenization).

It covers what LlamaFactory's own parser lets through and the job would only trip over later, inside the
worker: values of the wrong type or out of range (`lora_rank: "eight"`, `lora_rank: -1`), an output_dir
that cannot be created, checkpoints that do or do not match --resume, and harvest's own knobs. Each error
is a HarvestError naming the key or flag.
"""

import os
import types
import typing
from enum import Enum
from pathlib import Path
from typing import Any

from base.errors import HarvestError
from harvest.finetune.checkpoint_store import CheckpointStore
from harvest.finetune.finetune_config import FinetuneConfig
from harvest.finetune.llamafactory_args import LlamaFactoryArgs

# Ranges LlamaFactory and the HF Trainer do not check at parse time: (key, test, what the value must be).
RANGES = [
    ("lora_rank", lambda v: v >= 1, ">= 1"),
    ("lora_alpha", lambda v: v is None or v > 0, "> 0"),
    ("lora_dropout", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("learning_rate", lambda v: v > 0, "> 0"),
    ("per_device_train_batch_size", lambda v: v >= 1, ">= 1"),
    ("gradient_accumulation_steps", lambda v: v >= 1, ">= 1"),
    ("max_steps", lambda v: v >= 1 or v == -1, ">= 1 (or -1: num_train_epochs decides)"),
    ("num_train_epochs", lambda v: v > 0, "> 0"),
    ("save_steps", lambda v: v >= 0, ">= 0"),
    ("cutoff_len", lambda v: v >= 1, ">= 1"),
    ("max_samples", lambda v: v is None or v >= 1, ">= 1"),
    ("warmup_steps", lambda v: v >= 0, ">= 0"),
    ("warmup_ratio", lambda v: 0 <= v <= 1, "in [0, 1]"),
    ("weight_decay", lambda v: v >= 0, ">= 0"),
    ("max_grad_norm", lambda v: v >= 0, ">= 0"),
]


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


def check_values(raw: dict[str, Any]) -> None:
    """Types against LlamaFactory's own argument classes, then ranges; the first bad key is the error."""
    hints = _argument_types()
    for key, value in raw.items():
        if key in hints and not _matches(value, hints[key]):
            raise HarvestError(f"{key}: {value!r} is not {_describe(hints[key])}{_yaml_hint(value)}")
    for key, is_valid, what in RANGES:
        if raw.get(key) is not None and not is_valid(raw[key]):
            raise HarvestError(f"{key}: {raw[key]!r} must be {what}")


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
    import torch

    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise HarvestError(f"{flag} {device!r} is not a torch device (cpu, cuda, cuda:1)") from None
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise HarvestError(f"{flag} {device!r}: this host has no CUDA GPU")


def _argument_types() -> dict[str, Any]:
    from llamafactory.hparams import DataArguments, FinetuningArguments, ModelArguments, TrainingArguments

    hints = {}
    for cls in (TrainingArguments, ModelArguments, DataArguments, FinetuningArguments):
        try:
            hints.update(typing.get_type_hints(cls))
        except (NameError, TypeError):  # a forward reference this check cannot resolve: LlamaFactory decides
            pass
    return hints


def _matches(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in typing.get_args(hint))
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is str:  # comma-separated lists (dataset, lora_target) may also be YAML lists
        return isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))
    if isinstance(hint, type) and issubclass(hint, Enum):
        return isinstance(value, hint) or value in [member.value for member in hint]
    return True  # containers and classes: LlamaFactory's parser decides


def _describe(hint: Any) -> str:
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    if typing.get_origin(hint) is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    return " or ".join(names.get(a, getattr(a, "__name__", str(a))) for a in args)


def _yaml_hint(value: Any) -> str:
    try:
        float(value)
    except (TypeError, ValueError):
        return ""
    return " (YAML reads a number without a dot, like 1e-3, as text: write 1.0e-3)" if isinstance(value, str) else ""
